// Uploads: several files to the chosen collection, each with a progress bar that follows
// the document's `progress` until it is indexed or failed.
//
// Polling GET /api/v1/documents/{id}, not an event stream: the API has no document stream
// and a private one is not wanted; progress moves in a few coarse steps (parse, chunk,
// embed, index), so one small read per document per POLL_MS is cheap; and a browser holds
// at most six HTTP/1.1 connections per origin, which open EventSources would take from
// the answer stream.
"use strict";
(() => {
  const {api, el} = window.ragtier;
  const $ = id => document.getElementById(id);
  const POLL_MS = 500;
  const box = document.querySelector("section.upload");
  const maxBytes = Number(box.dataset.maxBytes);
  const extensions = box.dataset.extensions.split(",");

  // The API's own words (apps.knowledge.services.documents, retrieval.parsing), so that a
  // file refused here reads exactly as it would from the server.
  function refusal(file) {
    if (file.size > maxBytes) return `The file is ${file.size} bytes; the limit is ${maxBytes}.`;
    const dot = file.name.lastIndexOf(".");
    const extension = dot >= 0 ? file.name.slice(dot).toLowerCase() : "";
    if (!extensions.includes(extension)) {
      return `'${file.name}' is not a supported file type; upload txt, md, html or pdf`;
    }
    return null;
  }

  function showError(message) {
    $("upload-error").textContent = message;
    $("upload-error").hidden = !message;
  }

  function row(file) {
    const bar = el("progress", {max: "100", value: "0", "aria-label": `Indexing ${file.name}`});
    const status = el("span", {class: "status", text: "uploading"});
    const item = el("li", {"data-file": file.name}, el("span", {class: "name", text: file.name}), bar, status);
    $("documents").prepend(item);
    return {item, bar, status};
  }

  function show(view, doc) {
    view.bar.value = doc.progress;
    view.bar.setAttribute("aria-valuetext", `${doc.progress}%`);
    const text = doc.status === "failed" ? `failed: ${doc.error}` : doc.status === "indexed"
      ? "indexed" : `${doc.status} ${doc.progress}%`;
    view.status.textContent = text;
    view.item.className = doc.status;
  }

  function fail(view, message) {
    view.status.textContent = `failed: ${message}`;
    view.item.className = "failed";
  }

  async function follow(view, id) {
    for (;;) {
      let doc;
      try {
        doc = await api("GET", `/api/v1/documents/${id}`);
      } catch (err) {
        fail(view, err.message);
        return;
      }
      show(view, doc);
      if (doc.status === "indexed" || doc.status === "failed") return;
      await new Promise(resolve => window.setTimeout(resolve, POLL_MS));
    }
  }

  async function upload(file, collection) {
    const view = row(file);
    const message = refusal(file);
    if (message) { view.bar.remove(); fail(view, message); return; }  // not a document: no bar
    const form = new FormData();
    form.append("file", file);
    try {
      const doc = await api("POST", `/api/v1/collections/${collection}/documents`, form);
      show(view, doc);
      await follow(view, doc.id);
    } catch (err) {
      fail(view, err.message);
    }
  }

  $("upload").addEventListener("change", () => {
    showError("");
    const collection = $("collection").value;
    const files = [...$("upload").files];
    if (!files.length) return;
    if (!collection) { showError("Choose a collection, or create one with “New collection”."); return; }
    files.forEach(file => upload(file, collection));
    $("upload").value = "";
  });

  $("new-collection").addEventListener("click", async () => {
    const name = window.prompt("Name of the new collection")?.trim();
    if (!name) return;
    showError("");
    try {
      const collection = await api("POST", "/api/v1/collections", {name});
      $("collection").append(el("option", {value: collection.id, text: collection.name}));
      $("collection").value = String(collection.id);
      document.querySelector("#collections .empty")?.remove();
      const checkbox = el("input", {type: "checkbox", name: "collection", value: collection.id, checked: true});
      $("collections").append(el("label", {}, checkbox, ` ${collection.name}`));
    } catch (err) {
      showError(err.message);
    }
  });
})();
