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
