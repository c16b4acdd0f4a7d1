// The contents follow the reader: the section in view is marked in them.
// Tangled from mlplcode.org, chapter "Export".
(function () {
  const contents = document.getElementById("TOC");
  if (!contents || !("IntersectionObserver" in window)) return;
  const entries = [];
  for (const link of contents.querySelectorAll('a[href^="#"]')) {
    const heading = document.getElementById(decodeURIComponent(link.hash.slice(1)));
    if (heading) entries.push({ heading, link });
  }
  if (entries.length === 0) return;
  let current = null;

  function mark() {
    const line = window.innerHeight / 5;
    let found = entries[0];
    for (const entry of entries) {
      if (entry.heading.getBoundingClientRect().top > line) break;
      found = entry;
    }
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

  const line = Math.round(window.innerHeight / 5);
  const observer = new IntersectionObserver(mark, {
    rootMargin: `0px 0px -${window.innerHeight - line}px 0px`,
  });
  for (const entry of entries) observer.observe(entry.heading);
})();
