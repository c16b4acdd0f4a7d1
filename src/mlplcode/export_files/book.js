// The contents follow the reader: the section in view is marked in them.
// Tangled from mlplcode.org, chapter "Export".
(function () {
  const contents = document.getElementById("TOC");
  if (!contents) return;
  const entries = [];
  for (const link of contents.querySelectorAll('a[href^="#"]')) {
    const heading = document.getElementById(decodeURIComponent(link.hash.slice(1)));
    if (heading) entries.push({ heading, link });
  }
  if (entries.length === 0) return;
  let current = null;
  let waiting = false;

  function inView() {
    const line = window.innerHeight / 5;
    let low = 0;
    let high = entries.length - 1;
    while (low < high) {
      const middle = Math.ceil((low + high) / 2);
      if (entries[middle].heading.getBoundingClientRect().top <= line) {
        low = middle;
      } else {
        high = middle - 1;
      }
    }
    return entries[low];
  }

  function mark() {
    waiting = false;
    const found = inView();
    if (found === current) return;
    if (current) {
      current.link.classList.remove("current");
      current.link.removeAttribute("aria-current");
    }
    current = found;
    found.link.classList.add("current");
    found.link.setAttribute("aria-current", "location");
    if (getComputedStyle(contents).position === "fixed") {
      const box = found.link.getBoundingClientRect();
      const column = contents.getBoundingClientRect();
      if (box.top < column.top || box.bottom > column.bottom) {
        contents.scrollTop += box.top - column.top - column.height / 3;
      }
    }
  }

  function soon() {
    if (!waiting) {
      waiting = true;
      window.requestAnimationFrame(mark);
    }
  }

  window.addEventListener("scroll", soon, { passive: true });
  window.addEventListener("resize", soon);
  mark();
})();
