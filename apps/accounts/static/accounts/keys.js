// The API keys page: list, create (shown once) and revoke through /api/v1/keys; owners and
// admins also set a key's limits through /api/v1/keys/{prefix}/limits.
"use strict";
(() => {
  const {api, el, when} = window.ragtier;
  const $ = id => document.getElementById(id);
  if (!$("create-key")) return;
  const limitsForm = $("key-limits");  // only for owners and admins

  async function load() {
    const keys = await api("GET", "/api/v1/keys?limit=100");
    const rows = keys.results.map(key => {
      const revoke = key.revoked_at ? null :
        el("button", {type: "button", class: "danger", "aria-label": `Revoke ${key.prefix}`, text: "Revoke"});
      revoke?.addEventListener("click", () => revokeKey(key.prefix));
      const limits = limitsForm && !key.revoked_at ?
        el("button", {type: "button", "aria-label": `Limits of ${key.prefix}`, text: "Limits"}) : null;
      limits?.addEventListener("click", () => openLimits(key.prefix).catch(err => showError(err.message)));
      return el("tr", {"data-prefix": key.prefix},
        el("td", {}, el("code", {text: key.prefix})),
        el("td", {text: key.name || "—"}),
        el("td", {text: key.scopes.join(", ")}),
        el("td", {text: key.user ?? "—"}),
        el("td", {text: when(key.created_at)}),
        el("td", {text: when(key.last_used_at)}),
        el("td", {text: key.expires_at ? when(key.expires_at) : "never"}),
        el("td", {}, status(key), revoke ? " " : null, revoke, limits ? " " : null, limits));
    });
    $("keys-body").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", {colspan: "8", text: "No keys yet."}))]));
  }

  function status(key) {
    if (key.revoked_at) return `revoked ${when(key.revoked_at)}`;
    if (key.expires_at && new Date(key.expires_at) <= new Date()) return "expired";
    return "active";
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

  let limitsPrefix = null;
  const limitsPath = prefix => `/api/v1/keys/${encodeURIComponent(prefix)}/limits`;

  async function openLimits(prefix) {
    const limits = await api("GET", limitsPath(prefix));
    limitsPrefix = prefix;
    $("key-limits-title").textContent = `Limits of key ${prefix}`;
    for (const input of limitsForm.querySelectorAll("input")) input.value = limits[input.name] ?? "";
    $("key-limits-status").textContent = "";
    limitsForm.hidden = false;
    limitsForm.querySelector("input").focus();
  }

  limitsForm?.addEventListener("submit", async event => {
    event.preventDefault();
    const inputs = [...limitsForm.querySelectorAll("input")];
    const body = Object.fromEntries(inputs.map(i => [i.name, i.value === "" ? null : Number(i.value)]));
    try {
      await api("PUT", limitsPath(limitsPrefix), body);
      $("key-limits-status").textContent = "Saved.";
    } catch (err) {
      $("key-limits-status").textContent = err.message;
    }
  });

  function showError(message) {
    $("key-error").textContent = message;
    $("key-error").hidden = !message;
  }

  $("create-key").addEventListener("submit", async event => {
    event.preventDefault();
    showError("");
    const scopes = [...document.querySelectorAll("input[name=scope]:checked")].map(i => i.value);
    try {
      const days = $("key-expiry").value;
      const key = await api("POST", "/api/v1/keys", {
        name: $("key-name").value.trim(), scopes, expires_in_days: days ? Number(days) : null,
      });
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
