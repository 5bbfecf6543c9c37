// The chat page: conversations (list, reopen, new, delete), asking with a streamed answer
// rendered as safe markdown, its sources and its usage. Everything goes through the REST
// API with the session: /api/v1/conversations, …/messages (SSE), /api/v1/messages/…/cancel.
// A stream that breaks (a network drop) is resumed from the last event read
// (/api/v1/messages/…/events with Last-Event-ID), retrying with backoff as EventSource
// does; an answer still running when its conversation is opened (a refresh, a return) is
// replayed and followed live.
"use strict";
(() => {
  const {api, errorOf, el} = window.ragtier;
  const markdown = window.ragtierMarkdown;
  const $ = id => document.getElementById(id);
  const TITLE_CHARS = 60;
  const RETRY_MS = [500, 1000, 2000, 4000, 8000];  // then every 8 s, while the answer may run
  const RETRY_FOR_MS = 150_000;
  const CONNECT_MS = 10_000;  // a reconnect that gets no answer in this time is tried again
  let conversationId = null, messageId = null, controller = null, turns = 0;

  const truncate = text => text.length > TITLE_CHARS ? `${text.slice(0, TITLE_CHARS - 1).trimEnd()}…` : text;

  // --- conversations ------------------------------------------------------------------
  function setCurrent(id) {
    conversationId = id;
    const url = new URL(window.location.href);
    if (id === null) url.searchParams.delete("c"); else url.searchParams.set("c", id);
    window.history.replaceState(null, "", url);
    for (const link of document.querySelectorAll("#conversation-list a")) {
      if (Number(link.dataset.id) === id) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  async function loadConversations() {
    const page = await api("GET", "/api/v1/conversations?limit=50");
    const items = page.results.map(conversation => {
      const title = conversation.title || `Conversation ${conversation.id}`;
      const link = el("a", {href: `?c=${conversation.id}`, "data-id": conversation.id, title, text: title});
      if (conversation.id === conversationId) link.setAttribute("aria-current", "page");
      link.addEventListener("click", event => { event.preventDefault(); openConversation(conversation.id); });
      const remove = el("button", {type: "button", class: "danger", "aria-label": `Delete ${title}`, text: "Delete"});
      remove.addEventListener("click", () => deleteConversation(conversation.id, title));
      return el("li", {}, link, remove);
    });
    $("conversation-list").replaceChildren(...items);
  }

  async function openConversation(id) {
    if (controller) return;
    let conversation;
    try {
      conversation = await api("GET", `/api/v1/conversations/${id}`);
    } catch (err) {
      setCurrent(null);
      return;
    }
    setCurrent(conversation.id);
    $("transcript").replaceChildren();
    let turn = null, running = null;
    for (const message of conversation.messages) {
      if (message.role === "user") {
        turn = newTurn(message.content);
      } else if (message.role === "assistant") {
        turn = turn || newTurn("");
        if (message.status === "streaming" || message.status === "detached") {
          running = {turn, id: message.id};  // replayed from its first event, then live
        } else {
          showSources(turn, message.citations || []);
          turn.text = message.content;
          renderAnswer(turn);
          if (message.usage) showUsage(turn, message.usage);
          if (message.status === "cancelled") turn.usage.append(" · stopped");
        }
        turn = null;
      }
    }
    closeSidebar();
    if (running) await followRunning(running.turn, running.id);
  }

  // An answer that is still being generated: its events from the first, then live.
  async function followRunning(turn, id) {
    controller = new AbortController();
    messageId = id;
    $("stop").disabled = false; $("send").disabled = true;
    const stream = {lastId: 0};
    try {
      await resume(turn, stream);
    } finally {
      endAnswer(turn);
    }
  }

  async function deleteConversation(id, title) {
    if (!window.confirm(`Delete the conversation “${title}” and its messages?`)) return;
    await api("DELETE", `/api/v1/conversations/${id}`);
    if (id === conversationId) newConversation();
    await loadConversations();
  }

  function newConversation() {
    if (controller) return;
    setCurrent(null);
    $("transcript").replaceChildren();
    $("question").focus();
    closeSidebar();
  }

  // --- one turn: question, answer, sources, usage --------------------------------------
  function newTurn(question) {
    const number = ++turns;
    const turn = {number, text: "", sources: new Set(), scheduled: false};
    turn.node = el("article", {class: "turn"});
    turn.answer = el("div", {class: "answer"});
    turn.sourceList = el("ol", {"aria-label": "Sources"});
    turn.sourceBox = el("section", {class: "sources", hidden: true}, el("h3", {class: "visually-hidden", text: "Sources"}), turn.sourceList);
    turn.usage = el("div", {class: "usage"});
    turn.node.append(el("div", {class: "question", text: question}), turn.answer, turn.sourceBox, turn.usage);
    $("transcript").append(turn.node);
    return turn;
  }

  const sourceId = (turn, n) => `source-${turn.number}-${n}`;

  function showSources(turn, citations) {
    for (const citation of citations) {
      turn.sources.add(citation.id);
      const snippet = el("blockquote", {hidden: true, text: citation.snippet || ""});
      const toggle = el("button", {type: "button", "aria-expanded": "false", text: citation.title});
      toggle.addEventListener("click", () => {
        snippet.hidden = !snippet.hidden;
        toggle.setAttribute("aria-expanded", String(!snippet.hidden));
      });
      turn.sourceList.append(el("li", {id: sourceId(turn, citation.id), value: citation.id}, toggle, snippet));
    }
    turn.sourceBox.hidden = turn.sources.size === 0;
  }

  function renderAnswer(turn) {
    markdown.render(turn.answer, turn.text, turn.sources, n => `#${sourceId(turn, n)}`);
  }

  // Rendering once per frame keeps a fast stream from re-parsing on every token.
  function scheduleRender(turn) {
    if (turn.scheduled) return;
    turn.scheduled = true;
    window.requestAnimationFrame(() => { turn.scheduled = false; renderAnswer(turn); });
  }

  function showUsage(turn, usage) {
    turn.usage.textContent =
      `${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens ` +
      `(${usage.reasoning_tokens ?? 0} reasoning) · first token ${usage.ttft_ms ?? "–"} ms · ` +
      `${usage.tokens_per_second ?? "–"} tokens/s`;
  }

  function showError(turn, error) {
    turn.answer.append(el("div", {class: "error", role: "alert", text: error.message}));
  }

  function handle(turn, event, data) {
    if (event === "message") messageId = data.message_id;
    else if (event === "done") turn.done = true;
    else if (event === "retrieval") showSources(turn, data.citations);
    else if (event === "delta") { turn.text += data.text; scheduleRender(turn); }
    else if (event === "usage") showUsage(turn, data);
    else if (event === "error") showError(turn, data);
  }

  // --- asking ------------------------------------------------------------------------
  function selectedCollections() {
    return [...document.querySelectorAll("input[name=collection]:checked")].map(i => Number(i.value));
  }

  async function ask(question) {
    const turn = newTurn(question);
    const collections = selectedCollections();
    controller = new AbortController();
    $("stop").disabled = false; $("send").disabled = true;
    try {
      if (conversationId === null) {
        const created = await api("POST", "/api/v1/conversations", {title: truncate(question)});
        setCurrent(created.id);
        loadConversations();
      }
      const body = {content: question};
      if (collections.length) body.collections = collections;
      if ($("model")?.value) body.model = $("model").value;
      if ($("mode")?.value) body.mode = $("mode").value;
      const response = await api("POST", `/api/v1/conversations/${conversationId}/messages`, body,
        {raw: true, signal: controller.signal, headers: {"Accept": "text/event-stream"}});
      const stream = {lastId: 0};
      try {
        await readEvents(response, stream, (event, data) => handle(turn, event, data));
      } catch (err) {
        if (err.name === "AbortError") throw err;  // Stop
      }
      // The connection broke before `done` (a network drop): the answer goes on at the
      // server for a while; pick it up where it broke.
      if (!turn.done && messageId !== null) await resume(turn, stream);
    } catch (err) {
      if (err.name !== "AbortError") showError(turn, err.error || {message: String(err)});
    } finally {
      endAnswer(turn);
    }
  }

  function endAnswer(turn) {
    renderAnswer(turn);
    $("stop").disabled = true; $("send").disabled = false;
    controller = null; messageId = null;
  }

  // Follow the answer's events after the last one read, reconnecting with backoff until
  // `done` (or Stop, or RETRY_FOR_MS since the last event without getting anywhere).
  async function resume(turn, stream) {
    const id = messageId;
    let since = Date.now();  // the last progress
    for (let attempt = 0; !turn.done; attempt++) {
      const before = stream.lastId;
      const tried = new AbortController(), stop = () => tried.abort();
      controller.signal.addEventListener("abort", stop, {once: true});
      const timer = setTimeout(() => tried.abort(new DOMException("no answer", "TimeoutError")), CONNECT_MS);
      try {
        const response = await api("GET", `/api/v1/messages/${id}/events`, undefined, {
          raw: true, signal: tried.signal,
          headers: {"Accept": "text/event-stream", "Last-Event-ID": String(stream.lastId)},
        });
        clearTimeout(timer);
        await readEvents(response, stream, (event, data) => handle(turn, event, data));
      } catch (err) {
        if (err.name === "AbortError") throw err;
        if (err.status && err.status < 500 && err.status !== 429) throw err;  // gone, or not ours
      } finally {
        clearTimeout(timer);
        controller.signal.removeEventListener("abort", stop);
      }
      if (turn.done) return;
      if (stream.lastId > before) { attempt = 0; since = Date.now(); }  // it got somewhere: start over
      if (Date.now() - since > RETRY_FOR_MS) throw new Error("The connection was lost; reopen the conversation to see the answer.");
      await sleep(RETRY_MS[Math.min(attempt, RETRY_MS.length - 1)], controller.signal);
    }
  }

  const sleep = (ms, signal) => new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); reject(new DOMException("Stop", "AbortError")); }, {once: true});
  });

  async function readEvents(response, stream, onEvent) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let event = "message", data = "", id = null;
        for (const line of frame.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trimStart();
          else if (line.startsWith("id:")) id = Number(line.slice(3).trim());
        }
        if (!data) continue;
        if (id !== null && id <= stream.lastId) continue;  // read before the drop
        if (id !== null) stream.lastId = id;
        onEvent(event, JSON.parse(data));
      }
    }
  }

  // --- small screens: the list folds behind a button ---------------------------------
  function closeSidebar() {
    $("sidebar").classList.remove("open");
    $("sidebar-toggle").setAttribute("aria-expanded", "false");
  }

  $("sidebar-toggle").addEventListener("click", () => {
    const open = $("sidebar").classList.toggle("open");
    $("sidebar-toggle").setAttribute("aria-expanded", String(open));
  });
  $("new-conversation").addEventListener("click", newConversation);
  $("ask").addEventListener("submit", event => {
    event.preventDefault();
    const question = $("question").value.trim();
    if (question && !controller) { $("question").value = ""; ask(question); }
  });
  $("question").addEventListener("keydown", event => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("ask").requestSubmit(); }
  });
  $("stop").addEventListener("click", async () => {
    if (messageId !== null) {
      try { await api("POST", `/api/v1/messages/${messageId}/cancel`, {}); } catch (_) { /* ended already */ }
    }
    controller?.abort();
  });
  $("transcript").addEventListener("click", event => {
    const link = event.target.closest("a.cite");
    if (!link) return;
    event.preventDefault();
    const item = document.querySelector(link.getAttribute("href"));
    if (!item) return;
    for (const other of document.querySelectorAll(".sources li.highlight")) other.classList.remove("highlight");
    item.classList.add("highlight");
    item.scrollIntoView({block: "nearest"});
    item.querySelector("button").focus();
  });

  const initial = Number(new URL(window.location.href).searchParams.get("c"));
  loadConversations().catch(() => {});
  if (initial > 0) openConversation(initial);
})();
