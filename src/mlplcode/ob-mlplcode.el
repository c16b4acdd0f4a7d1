;;; ob-mlplcode.el --- Org-babel for mlplcode  -*- lexical-binding: t; -*-

;; This file is tangled from mlplcode.org (chapter "Org-babel"); edit the
;; book, not this file.

;;; Commentary:

;; A block such as
;;
;;   #+begin_src mlplcode :session agent
;;   %task Add a function mul(a, b) to calc.py
;;   #+end_src
;;
;; runs in the Jupyter kernel of its session, which stays alive between
;; blocks.  The work is done by the Python bridge `python3 -m mlplcode.babel';
;; this file only hands it the block and takes back the text.

;;; Code:

(require 'ob)
(require 'org-src)
(require 'seq)
(require 'subr-x)

(defgroup ob-mlplcode nil
  "Org-babel blocks run by the mlplcode Jupyter kernel."
  :group 'org-babel)

(defcustom ob-mlplcode-python "python3"
  "The Python interpreter that has mlplcode installed; it runs the bridge."
  :type 'string)

(defcustom ob-mlplcode-timeout 600
  "Seconds a block may run before the bridge interrupts it."
  :type 'number)

(defvar org-babel-default-header-args:mlplcode
  '((:session . "default") (:kernel . "mlplcode") (:results . "output"))
  "Every mlplcode block runs in a session, by default in the mlplcode kernel.")

(add-to-list 'org-src-lang-modes '("mlplcode" . text))

(defun ob-mlplcode--bridge (input &rest arguments)
  "Run the bridge with ARGUMENTS on INPUT; return (STATUS OUTPUT ERRORS).
STATUS is the bridge's exit status, or `quit' when \\[keyboard-quit]
cut the wait short; OUTPUT is the text the bridge wrote either way."
  (let ((output (make-temp-file "ob-mlplcode-"))
        (errors (make-temp-file "ob-mlplcode-"))
        (coding-system-for-read 'utf-8)
        (coding-system-for-write 'utf-8))
    (unwind-protect
        (let ((status (condition-case nil
                          (with-temp-buffer
                            (insert input)
                            (apply #'call-process-region (point-min) (point-max)
                                   ob-mlplcode-python nil (list nil errors) nil
                                   "-m" "mlplcode.babel" "--output" output arguments))
                        (quit 'quit))))
          (list status (ob-mlplcode--file-text output)
                (string-trim (ob-mlplcode--file-text errors))))
      (delete-file output)
      (delete-file errors))))

(defun ob-mlplcode--file-text (file)
  (with-temp-buffer
    (insert-file-contents file)
    (buffer-string)))

(defun ob-mlplcode--org-file ()
  "The true name of the org file whose block runs; nil for a buffer of no file."
  (let ((file (buffer-file-name (buffer-base-buffer (or org-babel-exp-reference-buffer
                                                         (current-buffer))))))
    (and file (file-truename file))))

(defun ob-mlplcode--scope ()
  "The bridge's arguments that name the org file, if there is one."
  (let ((file (ob-mlplcode--org-file)))
    (and file (list "--org-file" file))))

(defun org-babel-execute:mlplcode (body params)
  "Run BODY, the cells of an mlplcode block, in the kernel of its :session.
PARAMS are the block's header arguments."
  (let ((session (or (cdr (assq :session params)) "default"))
        (kernel (cdr (assq :kernel params))))
    (when (equal session "none")
      (user-error "An mlplcode block runs in a session: give it :session NAME"))
    (pcase-let ((`(,status ,output ,errors)
                 (apply #'ob-mlplcode--bridge body "--session" session "--kernel" kernel
                        "--timeout" (format "%s" ob-mlplcode-timeout)
                        (ob-mlplcode--scope))))
      (pcase status
        (0 output)
        (1 (message "mlplcode: the block ended in an error; its results say which")
           output)
        ((or 3 'quit)
         (ob-mlplcode--signal-after-results
          (if (eq status 'quit) '(quit) (list 'error (format "mlplcode: %s" errors))))
         output)
        (_ (error "mlplcode: %s" (if (string-empty-p errors)
                                     (format "the bridge failed (%s)" status)
                                   errors)))))))

(defvar ob-mlplcode--pending-signal nil
  "The signal to raise once Org has written an unfinished block's results.")

(defun ob-mlplcode--signal-after-results (signal)
  (setq ob-mlplcode--pending-signal signal)
  (add-hook 'org-babel-after-execute-hook #'ob-mlplcode--raise-pending-signal))

(defun ob-mlplcode--raise-pending-signal ()
  (remove-hook 'org-babel-after-execute-hook #'ob-mlplcode--raise-pending-signal)
  (let ((pending ob-mlplcode--pending-signal))
    (setq ob-mlplcode--pending-signal nil)
    (when pending
      (signal (car pending) (cdr pending)))))

(defun ob-mlplcode--session-at-point ()
  "The :session of the mlplcode block at point, or \"default\"."
  (or (when (derived-mode-p 'org-mode)
        (let ((info (org-babel-get-src-block-info 'no-eval)))
          (when (equal (nth 0 info) "mlplcode")
            (cdr (assq :session (nth 2 info))))))
      "default"))

(defun ob-mlplcode-stop-session (session)
  "Stop the kernel of the mlplcode SESSION of this org file.
The state of its agent is lost; its journal keeps the run."
  (interactive (list (read-string "Stop mlplcode session: "
                                  (ob-mlplcode--session-at-point))))
  (pcase-let ((`(,status ,output ,errors)
               (apply #'ob-mlplcode--bridge "" "--session" session "--stop"
                      (ob-mlplcode--scope))))
    (if (eql status 0)
        (message "%s" (string-trim output))
      (error "mlplcode: %s" errors))))

(defconst ob-mlplcode-stepping-commands
  '("step" "run" "approve" "deny" "compact" "show" "help")
  "Commands that Org need not ask about: they carry on the session's run.")

(defun ob-mlplcode--stepping-p (body)
  "Whether BODY is a note, or only `ob-mlplcode-stepping-commands'."
  (let ((lines (split-string (string-trim body) "\n" t "[ \t\r]*")))
    (or (not (string-prefix-p "%" (car lines)))
        (seq-every-p (lambda (line)
                       (and (string-match "\\`%\\([A-Za-z]+\\)\\(?:[ \t]\\|\\'\\)" line)
                            (member (match-string 1 line)
                                    ob-mlplcode-stepping-commands)))
                     lines))))

(defun ob-mlplcode--block-kernel ()
  "The :kernel of the mlplcode block that Org runs; nil if it cannot tell."
  (when org-babel-current-src-block-location
    (save-excursion
      (goto-char org-babel-current-src-block-location)
      (let ((info (org-babel-get-src-block-info 'no-eval)))
        (and (equal (nth 0 info) "mlplcode") (cdr (assq :kernel (nth 2 info))))))))

(defun ob-mlplcode-allow-stepping-blocks ()
  "Let Org run, without asking, mlplcode blocks that only step their run.
`org-confirm-babel-evaluate', as it was, decides for every other block."
  (let ((previous org-confirm-babel-evaluate))
    (setq org-confirm-babel-evaluate
          (lambda (language body)
            (and (not (and (equal language "mlplcode")
                           (not (string-empty-p (string-trim body)))
                           (ob-mlplcode--stepping-p body)
                           (equal (ob-mlplcode--block-kernel) "mlplcode")))
                 (if (functionp previous)
                     (funcall previous language body)
                   previous))))))

(provide 'ob-mlplcode)
;;; ob-mlplcode.el ends here
