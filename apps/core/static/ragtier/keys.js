// The API keys page: list, create (shown once) and revoke through /api/v1/keys.
"use strict";
(() => {
  const {api, el, when} = window.ragtier;
  const $ = id => document.getElementById(id);
  if (!$("create-key")) return;

  async function load() {
    const keys = await api("GET", "/api/v1/keys?limit=100");
    const rows = keys.results.map(key => {
      const revoke = key.revoked_at ? null :
        el("button", {type: "button", class: "danger", "aria-label": `Revoke ${key.prefix}`, text: "Revoke"});
      revoke?.addEventListener("click", () => revokeKey(key.prefix));
      return el("tr", {"data-prefix": key.prefix},
        el("td", {}, el("code", {text: key.prefix})),
        el("td", {text: key.name || "—"}),
        el("td", {text: key.scopes.join(", ")}),
        el("td", {text: key.user ?? "—"}),
        el("td", {text: when(key.created_at)}),
        el("td", {text: when(key.last_used_at)}),
        el("td", {}, key.revoked_at ? `revoked ${when(key.revoked_at)}` : "active", revoke ? " " : null, revoke));
    });
    $("keys-body").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", {colspan: "7", text: "No keys yet."}))]));
  }

  async function revokeKey(prefix) {
    if (!window.confirm(`Revoke the key ${prefix}…? Programs using it stop working at once.`)) return;
    try {
      await api("DELETE", `/api/v1/keys/${encodeURIComponent(prefix)}`);
    } catch (err) {
      showError(err.message);
    }
    await load();
  }

  function showError(message) {
    $("key-error").textContent = message;
    $("key-error").hidden = !message;
  }

  $("create-key").addEventListener("submit", async event => {
    event.preventDefault();
    showError("");
    const scopes = [...document.querySelectorAll("input[name=scope]:checked")].map(i => i.value);
    try {
      const key = await api("POST", "/api/v1/keys", {name: $("key-name").value.trim(), scopes});
      $("new-key-secret").textContent = key.key;
      $("new-key").hidden = false;
      $("key-name").value = "";
    } catch (err) {
      showError(err.message);
    }
    await load();
  });

  load().catch(err => showError(err.message));
})();
