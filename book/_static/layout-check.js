// Used by the book's tests only: with ?layout-check in the URL, after MathJax has typeset the page,
// record on <body> every display equation wider than the column that holds it (it would be clipped
// or scrolled at the site's width). Without the query string it does nothing.
(function () {
  if (!window.location.search.includes("layout-check")) return;
  function report() {
    var wide = [];
    document.querySelectorAll('mjx-container[display="true"]').forEach(function (container, index) {
      var math = container.querySelector("mjx-math") || container;
      var column = container.closest("div.math, div.cell_output, article") || container.parentElement;
      var width = math.getBoundingClientRect().width, room = column.getBoundingClientRect().width;
      if (width > room + 1) wide.push({ index: index, width: Math.round(width), room: Math.round(room) });
    });
    document.body.setAttribute("data-wide-math", JSON.stringify(wide));
  }
  window.addEventListener("load", function () {
    var ready = window.MathJax && MathJax.startup && MathJax.startup.promise;
    (ready ? MathJax.startup.promise : Promise.resolve()).then(report);
  });
})();
