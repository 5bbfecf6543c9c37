// Helpers shared by the pages: the CSRF token, JSON calls to the REST API, elements.
"use strict";
window.ragtier = (() => {
  const csrf = () => document.cookie.split("; ").find(c => c.startsWith("csrftoken="))?.split("=")[1] ?? "";

  // The API's error object ({type, code, message, param}) of a failed response.
  async function errorOf(response) {
    try {
      const body = await response.json();
      if (body && body.error) return body.error;
    } catch (_) { /* not JSON */ }
    return {type: "http_error", code: String(response.status), message: `HTTP ${response.status}`};
  }

  class ApiError extends Error {
    constructor(error, status) { super(error.message); this.error = error; this.status = status; }
  }

  // fetch() against the REST API with the session; JSON in, JSON out, errors thrown.
  async function api(method, path, body, options = {}) {
    const headers = {"X-CSRFToken": csrf(), "Accept": "application/json", ...(options.headers || {})};
    let payload = body;
    if (body !== undefined && !(body instanceof FormData)) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    const response = await fetch(path, {method, credentials: "same-origin", headers, body: payload, signal: options.signal});
    if (!response.ok) throw new ApiError(await errorOf(response), response.status);
    if (response.status === 204 || options.raw) return response;
    return response.json();
  }

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else node.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  const when = iso => iso ? new Date(iso).toLocaleString() : "never";

  return {csrf, api, errorOf, ApiError, el, when};
})();
