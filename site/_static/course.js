// Three fixes to the pinned theme's behaviour, on every page of the site.
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
    if (output.querySelector("img") || output.scrollHeight <= 720) return;
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
  // On the search page the language switch keeps the query.
  if (location.pathname.endsWith("/search.html")) {
    document.querySelectorAll("a.course-lang").forEach((a) => { a.href += location.search; });
  }
  // A search result's excerpt comes from the page's text, not from its header links or its (printed) contents.
  if (typeof Search !== "undefined") {
    const toText = Search.htmlToText;
    Search.htmlToText = (html, anchor) => {
      const page = new DOMParser().parseFromString(html, "text/html");
      page.querySelectorAll(".bd-header-article, .bd-sidebar-secondary, .onlyprint, .prev-next-area").forEach((e) => e.remove());
      return toText(page.documentElement.outerHTML, anchor);
    };
  }
});
