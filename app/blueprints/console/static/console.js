/* The console's one script (served by the app: the CSP allows scripts from 'self' only, never inline).
   Progressive: a [data-copy] button (hidden without script) copies the text of the element it names;
   a form[data-confirm] (revoking a key, cancelling a checkout: what cannot be undone) asks its question
   before it is sent. */
"use strict";
document.querySelectorAll("button[data-copy]").forEach(function (button) {
  var target = document.getElementById(button.dataset.copy);
  if (!target) return;
  button.hidden = false;
  button.addEventListener("click", function () {
    var text = target.textContent.trim();
    var done = function (label) { button.textContent = label; };
    var select = function () {
      var range = document.createRange();
      range.selectNodeContents(target);
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      done("Selected: press Ctrl+C");
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done("Copied"); }, select);
    } else {
      select();
    }
  });
});
document.querySelectorAll("form[data-confirm]").forEach(function (form) {
  form.addEventListener("submit", function (event) {
    if (!window.confirm(form.dataset.confirm)) event.preventDefault();
  });
});
