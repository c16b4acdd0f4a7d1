;;; ob-mlplcode.el --- Org-babel blocks run by the mlplcode Jupyter kernel  -*- lexical-binding: t; -*-

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
  "Run the bridge with ARGUMENTS on INPUT; return (STATUS OUTPUT ERRORS)."
  (let ((errors (make-temp-file "ob-mlplcode-"))
        (coding-system-for-read 'utf-8)
        (coding-system-for-write 'utf-8))
    (unwind-protect
        (with-temp-buffer
          (insert input)
          (let ((status (apply #'call-process-region (point-min) (point-max)
                               ob-mlplcode-python t (list t errors) nil
                               "-m" "mlplcode.babel" arguments)))
            (list status
                  (buffer-string)
                  (with-temp-buffer
                    (insert-file-contents errors)
                    (string-trim (buffer-string))))))
      (delete-file errors))))

(defun org-babel-execute:mlplcode (body params)
  "Run BODY, the cells of an mlplcode block, in the kernel of its :session.
PARAMS are the block's header arguments."
  (let ((session (or (cdr (assq :session params)) "default"))
        (kernel (cdr (assq :kernel params))))
    (when (equal session "none")
      (user-error "An mlplcode block runs in a session: give it :session NAME"))
    (pcase-let ((`(,status ,output ,errors)
                 (ob-mlplcode--bridge body "--session" session "--kernel" kernel
                                      "--timeout" (format "%s" ob-mlplcode-timeout))))
      (pcase status
        (0 output)
        (1 (message "mlplcode: the block ended in an error; its results say which")
           output)
        (_ (error "mlplcode: %s" (if (string-empty-p errors)
                                     (format "the bridge failed (%s)" status)
                                   errors)))))))

(defun ob-mlplcode--session-at-point ()
  "The :session of the mlplcode block at point, or \"default\"."
  (or (when (derived-mode-p 'org-mode)
        (let ((info (org-babel-get-src-block-info 'no-eval)))
          (when (equal (nth 0 info) "mlplcode")
            (cdr (assq :session (nth 2 info))))))
      "default"))

(defun ob-mlplcode-stop-session (session)
  "Stop the kernel of the mlplcode SESSION; the state of its agent is lost."
  (interactive (list (read-string "Stop mlplcode session: "
                                  (ob-mlplcode--session-at-point))))
  (pcase-let ((`(,status ,output ,errors)
               (ob-mlplcode--bridge "" "--session" session "--stop")))
    (if (eql status 0)
        (message "%s" (string-trim output))
      (error "mlplcode: %s" errors))))

(provide 'ob-mlplcode)
;;; ob-mlplcode.el ends here
