// Markdown of answers, made safe: marked turns text into HTML, DOMPurify (the HTML profile:
// no script, no inline handler, no style, no form, no SVG) cleans it, and only then does it
// reach the page. The Content-Security-Policy forbids inline scripts besides.
"use strict";
window.ragtierMarkdown = (() => {
  const PURIFY = {
    USE_PROFILES: {html: true},
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "img", "iframe"],
    FORBID_ATTR: ["style", "id", "name", "class"],
  };
  window.DOMPurify.addHook("afterSanitizeAttributes", node => {
    if (node.tagName === "A") {
      node.setAttribute("rel", "noopener noreferrer nofollow");
      node.setAttribute("target", "_blank");
    }
  });

  // [n] in the answer's text (never inside code or a link) → a link to source n.
  function linkCitations(root, numbers, hrefFor) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: node => node.parentElement.closest("code, pre, a") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
    });
    const nodes = [];
    while (walker.nextNode()) if (/\[\d+\]/.test(walker.currentNode.data)) nodes.push(walker.currentNode);
    for (const node of nodes) {
      const parts = node.data.split(/(\[\d+\])/);
      const fragment = document.createDocumentFragment();
      for (const part of parts) {
        const match = /^\[(\d+)\]$/.exec(part);
        if (match && numbers.has(Number(match[1]))) {
          const link = document.createElement("a");
          link.className = "cite";
          link.href = hrefFor(Number(match[1]));
          link.dataset.source = match[1];
          link.textContent = part;
          fragment.append(link);
        } else if (part) {
          fragment.append(part);
        }
      }
      node.replaceWith(fragment);
    }
  }

  function render(target, text, numbers, hrefFor) {
    const html = window.marked.parse(text, {gfm: true, breaks: true, async: false});
    target.replaceChildren(window.DOMPurify.sanitize(html, {...PURIFY, RETURN_DOM_FRAGMENT: true}));
    linkCitations(target, numbers, hrefFor);
  }

  return {render};
})();
