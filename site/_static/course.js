// Fixes to the pinned theme's behaviour and the course's own touches, on every page of the site.
document.addEventListener("DOMContentLoaded", () => {
  // The article header's menu buttons and the (hidden) top bar's carry the same classes; the theme's script binds
  // only the first of each, the top bar's, so the visible ones pass their click on to it.
  for (const kind of ["primary", "secondary"]) {
    const bound = document.querySelector(`.bd-header .${kind}-toggle`);
    document.querySelectorAll(`.bd-header-article .${kind}-toggle`).forEach((button) => {
      if (!bound || button === bound) return;
      button.addEventListener("click", (event) => {
        event.preventDefault();
        event.stopPropagation();
        bound.click();
      });
    });
  }
  // A long output (a listing, a diff, a log) is capped at about 30 lines, with a button that shows all of it;
  // figures are never capped.
  const zh = document.documentElement.lang.startsWith("zh");
  const more = zh ? "展开全部输出" : "Show the whole output", less = zh ? "收起" : "Show less";
  document.querySelectorAll(".cell_output").forEach((output) => {
    if (output.querySelector("img") || output.scrollHeight <= 600) return;  // the cap is 576 px: capped if any taller
    output.classList.add("course-capped");
    const button = document.createElement("button");
    button.className = "course-expand";
    button.type = "button";
    button.textContent = more;
    button.addEventListener("click", () => {
      button.textContent = output.classList.toggle("course-capped") ? more : less;
    });
    output.after(button);
  });
  // On a phone a table's rows stack and its header is hidden (course.css): each cell carries its column's name.
  document.querySelectorAll(".bd-article table").forEach((table) => {
    const names = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
    table.querySelectorAll("tbody tr").forEach((row) => {
      [...row.cells].forEach((cell, i) => { if (names[i]) cell.dataset.label = names[i]; });
    });
  });
  // A figure opens at its own size above the page, where a phone pans across it and its text reads at 10 pt; the
  // link to the SVG alone stays for a new tab or a browser without scripts.
  document.querySelectorAll("a.figure-open").forEach((link) => {
    link.addEventListener("click", (event) => {
      if (event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
      event.preventDefault();
      openFigure(link.querySelector("img"), zh);
    });
  });
  // On the search page the language switch keeps the query, and the page says how many pages the other edition
  // finds for it: its own search runs in a hidden frame (which does not look further itself).
  if (location.pathname.endsWith("/search.html")) {
    document.querySelectorAll("a.course-lang").forEach((a) => { a.href += location.search; });
    const other = document.querySelector("a.course-lang");
    const query = new URLSearchParams(location.search).get("q");
    if (other && query && window.parent === window) countElsewhere(other, zh);
    if (query) linkSections(query.toLowerCase().split(/\s+/).filter((word) => word));
  }
  // A term joined by a hyphen or a dot (all-reduce, torch.compile) is highlighted whole, on the search page and on
  // the page a result opens, not only its last part (Sphinx splits it and drops "all" as a stop word).
  if (typeof Search !== "undefined") {
    const parse = Search._parseQuery;
    Search._parseQuery = (query) => {
      const parsed = parse(query), highlight = parsed[3];
      const joined = query.toLowerCase().trim().split(/\s+/).filter((word) => /\w[-.]\w/.test(word));
      joined.forEach((word) => {
        splitQuery(word).forEach((part) => highlight.delete(part.toLowerCase()));
        highlight.add(word);
      });
      if (joined.length) localStorage.setItem("sphinx_highlight_terms", [...highlight].join(" "));
      return parsed;
    };
  }
  // A search result's excerpt comes from the page's text, not from its header links, its (printed) contents or the
  // setup cell every notebook opens with (conf.py leaves it out of the index).
  if (typeof Search !== "undefined") {
    const toText = Search.htmlToText;
    Search.htmlToText = (html, anchor) => {
      const page = new DOMParser().parseFromString(html, "text/html");
      const left = ".bd-header-article, .bd-sidebar-secondary, .onlyprint, .prev-next-area, .no-search";
      page.querySelectorAll(left).forEach((e) => e.remove());
      return toText(page.documentElement.outerHTML, anchor);
    };
  }
});

// Run the other edition's search for this page's query in a hidden frame; say above the results how many it found.
function countElsewhere(link, zh) {
  const frame = document.createElement("iframe");
  frame.hidden = true;
  frame.src = link.href;
  document.body.append(frame);
  const started = Date.now();
  const poll = setInterval(() => {
    // Sphinx adds the results one by one and fills in the summary's text once the last is shown
    const summary = frame.contentDocument && frame.contentDocument.querySelector("#search-results .search-summary");
    const done = summary && summary.textContent.trim();
    if (!done && Date.now() - started < 20000) return;
    clearInterval(poll);
    const found = done ? frame.contentDocument.querySelectorAll("#search-results ul.search li").length : null;
    frame.remove();
    if (found === null) return;
    const note = document.createElement("p");
    note.className = "course-elsewhere";
    const a = document.createElement("a");
    a.href = link.href;
    a.textContent = zh ? `英文版找到 ${found} 个页面` : `The Chinese edition finds ${found} page${found === 1 ? "" : "s"}`;
    note.append(a, zh ? "。" : ".");
    document.querySelector("#search-results").before(note);
  }, 200);
}

// Each page the search lists links to the first section whose own text holds a word of the query, named under it.
function linkSections(words) {
  const results = document.querySelector("#search-results");
  if (!results) return;
  new MutationObserver(() => {
    results.querySelectorAll("ul.search li:not([data-section])").forEach((item) => {
      item.dataset.section = "";
      const link = item.querySelector("a");
      if (link && !link.hash) fetch(link.href).then((r) => r.text()).then((html) => nameSection(item, link, html, words));
    });
  }).observe(results, { childList: true, subtree: true });
}

function nameSection(item, link, html, words) {
  const page = new DOMParser().parseFromString(html, "text/html");
  for (const section of page.querySelectorAll(".bd-article section[id]")) {
    const own = section.cloneNode(true);
    own.querySelectorAll("section").forEach((inner) => inner.remove());
    const heading = own.querySelector("h1, h2, h3, h4");
    if (!heading || !words.some((word) => own.textContent.toLowerCase().includes(word))) continue;
    if (heading.tagName === "H1") return;  // the page's own introduction: the page is the place
    link.hash = section.id;
    const name = document.createElement("span");
    name.className = "course-section";
    name.textContent = " › " + heading.textContent.replace(/#$/, "").trim();
    link.after(name);
    return;
  }
}

// The figure at its natural size over the page, scrollable both ways; a button, Escape, the backdrop or the browser's
// Back closes it: opening adds an entry to the history (a phone's Back would leave the page), closing takes it away.
function openFigure(img, zh) {
  const viewer = document.createElement("div");
  viewer.className = "course-viewer";
  viewer.setAttribute("role", "dialog");
  viewer.setAttribute("aria-label", img.alt);
  const big = img.cloneNode();
  big.removeAttribute("class");
  big.style.width = `${img.naturalWidth}px`;
  const close = document.createElement("button");
  close.type = "button";
  close.textContent = zh ? "关闭 ✕" : "Close ✕";
  const shut = (byBack) => {
    viewer.remove();
    document.removeEventListener("keydown", onKey);
    window.removeEventListener("popstate", onBack);
    if (!byBack && history.state && history.state.courseViewer) history.back();  // the entry opening added
  };
  const onKey = (event) => { if (event.key === "Escape") shut(false); };
  const onBack = () => shut(true);
  close.addEventListener("click", () => shut(false));
  viewer.addEventListener("click", (event) => { if (event.target === viewer) shut(false); });
  document.addEventListener("keydown", onKey);
  history.pushState({ courseViewer: true }, "");
  window.addEventListener("popstate", onBack);
  viewer.append(close, big);
  document.body.append(viewer);
  close.focus();
}
