// kvchat page helpers: a light/dark switch remembered per browser, and keyboard shortcuts.
(() => {
  const THEME_KEY = "kvchat-theme";

  function applyTheme(theme) {
    document.body.classList.toggle("dark", theme === "dark");
  }

  function preferredTheme() {
    const saved = localStorage.getItem(THEME_KEY);
    if (saved) return saved;
    return window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  function addThemeSwitch() {
    const button = document.createElement("button");
    button.id = "theme-switch";
    button.type = "button";
    button.title = "Switch between light and dark";
    button.setAttribute("aria-label", button.title);
    const label = () => (document.body.classList.contains("dark") ? "☀" : "☾");
    button.textContent = label();
    button.addEventListener("click", () => {
      const next = document.body.classList.contains("dark") ? "light" : "dark";
      localStorage.setItem(THEME_KEY, next);
      applyTheme(next);
      button.textContent = label();
    });
    document.body.appendChild(button);
  }

  // Ctrl/Cmd+Shift+O starts a new chat; Escape stops a streaming reply.
  function addShortcuts() {
    document.addEventListener("keydown", (event) => {
      const modifier = event.ctrlKey || event.metaKey;
      if (modifier && event.shiftKey && event.key.toLowerCase() === "o") {
        document.querySelector("#new-chat")?.click();
        event.preventDefault();
      } else if (event.key === "Escape") {
        document.querySelector("#stop:not(.hidden)")?.click();
      }
    });
  }

  // The Enter that picks a candidate while an input method composes (Chinese, Japanese) is the input
  // method's, not a send: it never reaches the message box's own key handlers.  Capture phase, so this runs
  // first; no preventDefault, so the input method still gets the key.
  function guardComposition() {
    for (const type of ["keydown", "keypress"]) {
      document.addEventListener(
        type,
        (event) => {
          const composing = event.isComposing || event.keyCode === 229;
          if (event.key === "Enter" && composing && event.target.closest?.("#message")) {
            event.stopImmediatePropagation();
          }
        },
        true,
      );
    }
  }

  function start() {
    applyTheme(preferredTheme());
    addThemeSwitch();
    addShortcuts();
    guardComposition();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
