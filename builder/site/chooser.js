// The chooser and the copy buttons. Without JavaScript the index is a plain table whose
// headings link to pre-sorted copies; with it, the form (GET: the choice is in the URL) hides
// the rows that do not fit and the headings keep the choice.
"use strict";
(function () {
  function numeric(text) {
    const out = [];
    for (const part of String(text || "").replace("+", ".").split(".")) {
      const m = /^\d+/.exec(part);
      if (!m) break;
      out.push(parseInt(m[0], 10));
      if (m[0] !== part) break;
    }
    return out;
  }
  function compare(a, b) {
    for (let i = 0; i < Math.max(a.length, b.length); i++) {
      const d = (a[i] || 0) - (b[i] || 0);
      if (d) return d;
    }
    return 0;
  }
  // As smoke/versions.py arch_supported: sm_XY runs on the same major with minor >= Y
  // (sm_XYa: exactly XY); compute_XY (PTX) on anything >= XY.
  function archSupported(capability, archs) {
    const [major, minor] = numeric(capability);
    return archs.some(function (arch) {
      const m = /^(sm|compute)_(\d+)(\d)([af]?)$/.exec(arch);
      if (!m) return false;
      const aMajor = parseInt(m[2], 10), aMinor = parseInt(m[3], 10);
      if (m[1] === "compute") return compare([aMajor, aMinor], [major, minor]) <= 0;
      if (aMajor !== major) return false;
      return m[4] === "a" ? aMinor === minor : aMinor <= minor;
    });
  }
  function fits(row, choice) {
    const cuda = row.dataset.accelerator === "cuda";
    if (choice.driver && cuda && row.dataset.minDriver &&
        compare(numeric(row.dataset.minDriver), numeric(choice.driver)) > 0) return false;
    if (choice.gpu) {
      if (!cuda) return false;
      const archs = row.dataset.archs.split(" ").filter(Boolean);
      if (archs.length && !archSupported(choice.gpu, archs)) return false;
    }
    if (choice.platform && !row.dataset.platforms.split(" ").includes(choice.platform)) return false;
    if (choice.python && row.dataset.python !== choice.python) return false;
    if (choice.flavor && row.dataset.flavor !== choice.flavor) return false;
    return true;
  }
  function setUpChooser(form) {
    const rows = Array.from(document.querySelectorAll("#images tbody tr"));
    const params = new URLSearchParams(window.location.search);
    for (const [key, value] of params) {
      if (form.elements[key]) form.elements[key].value = value;
    }
    function apply() {
      const choice = Object.fromEntries(new FormData(form));
      let shown = 0;
      for (const row of rows) {
        row.hidden = !fits(row, choice);
        if (!row.hidden) shown++;
      }
      document.getElementById("count").textContent = shown + " of " + rows.length + " images";
      document.getElementById("none").hidden = shown > 0;
      const query = new URLSearchParams(choice).toString();
      for (const link of document.querySelectorAll("th a[data-sort]")) {
        link.search = query;
      }
    }
    form.hidden = false;
    form.addEventListener("input", apply);
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      apply();
    });
    apply();
  }
  function setUpCopy(button) {
    button.addEventListener("click", function () {
      const text = document.getElementById(button.dataset.copy).textContent;
      const done = function () { button.textContent = "copied"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, function () { button.textContent = "select and copy"; });
      } else {
        const range = document.createRange();
        range.selectNodeContents(document.getElementById(button.dataset.copy));
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        button.textContent = document.execCommand("copy") ? "copied" : "selected";
      }
    });
  }
  const form = document.getElementById("chooser");
  if (form) setUpChooser(form);
  document.querySelectorAll("button.copy").forEach(setUpCopy);
})();
