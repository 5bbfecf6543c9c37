// The `openai` npm package, unmodified, and a raw `fetch` as the Vercel AI SDK sends
// content parts, against the app at RAGTIER_BASE_URL with RAGTIER_API_KEY.
// Usage: node clients.mjs <case> [json options]; prints one JSON object, the case's result.
// tests/apps/chat/test_clients_node.py runs it and checks what it prints.
import OpenAI from "openai";

const baseURL = `${process.env.RAGTIER_BASE_URL}/v1`;
const apiKey = process.env.RAGTIER_API_KEY;
const [, , name, raw] = process.argv;
const options = JSON.parse(raw ?? "{}");
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });

async function streamChat() {
  const stream = await client.chat.completions.create({
    model: "small",
    messages: [{ role: "user", content: options.question ?? "Say hello" }],
    stream: true,
    stream_options: { include_usage: true },
    ...options.fields,
  });
  const deltas = [];
  const finishReasons = [];
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    for (const choice of chunk.choices) {
      if (choice.delta.content) deltas.push(choice.delta.content);
      if (choice.finish_reason) finishReasons.push(choice.finish_reason);
    }
    if (chunk.usage) usage = { ...chunk.usage, choices: chunk.choices.length };
  }
  return { text: deltas.join(""), deltas: deltas.length, chunks, finishReasons, usage };
}

async function embeddings() {
  const text = await client.embeddings.create({ model: options.model, input: options.input });
  // The SDK asks for base64 when no format is given and decodes it to numbers itself.
  const floats = await client.embeddings.create({
    model: options.model,
    input: options.input,
    encoding_format: "float",
  });
  return {
    vectors: text.data.map((d) => d.embedding),
    indexes: text.data.map((d) => d.index),
    floats: floats.data.map((d) => d.embedding),
    usage: text.usage,
    model: text.model,
  };
}

async function errorOf(call) {
  try {
    await call();
  } catch (error) {
    if (error instanceof OpenAI.APIError) {
      return { status: error.status, code: error.code, param: error.param, kind: error.constructor.name };
    }
    throw error;
  }
  return null;
}

async function errors() {
  return {
    temperature: await errorOf(() =>
      client.chat.completions.create({
        model: "small",
        messages: [{ role: "user", content: "x" }],
        temperature: 3,
      }),
    ),
    image: await errorOf(() =>
      client.chat.completions.create({
        model: "small",
        messages: [
          { role: "user", content: [{ type: "image_url", image_url: { url: "data:," } }] },
        ],
      }),
    ),
  };
}

// What the Vercel AI SDK's OpenAI-compatible provider puts on the wire for a user turn of
// several parts: `content` as a list of text parts, streamed with usage.
async function vercelParts() {
  const response = await fetch(`${baseURL}/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({
      model: "small",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: options.parts.map((text) => ({ type: "text", text })) },
      ],
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  const body = await response.text();
  // Each event here is one `data:` line; SSE lines may end in CRLF, LF or CR.
  const events = body
    .split(/\r\n|\r|\n/)
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice("data:".length).trimStart());
  const chunks = events.filter((data) => data !== "[DONE]").map((data) => JSON.parse(data));
  const text = chunks.flatMap((c) => c.choices.map((choice) => choice.delta.content ?? "")).join("");
  return {
    status: response.status,
    contentType: response.headers.get("content-type"),
    text,
    last: events.at(-1),
    usage: chunks.findLast((c) => c.usage)?.usage ?? null,
  };
}

// A tools turn: streamed with the package's own stream helper (which joins each call's
// argument deltas by index), then the call's result sent back as a `tool` message.
async function tools() {
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  const stream = client.chat.completions.stream({
    model: "small",
    messages,
    tools: options.tools,
    rag: { enabled: false },
  });
  let fragments = 0;
  for await (const chunk of stream) {
    fragments += chunk.choices[0]?.delta?.tool_calls?.length ?? 0;
  }
  const final = await stream.finalChatCompletion();
  const asked = final.choices[0].message;
  const results = asked.tool_calls.map((call) => ({
    role: "tool",
    tool_call_id: call.id,
    content: "18 C and sunny",
  }));
  const next = await client.chat.completions.create({
    model: "small",
    messages: [...messages, asked, ...results],
    tools: options.tools,
    rag: { enabled: false },
  });
  return {
    fragments,
    finishReason: final.choices[0].finish_reason,
    calls: asked.tool_calls,
    next: { finishReason: next.choices[0].finish_reason, message: next.choices[0].message },
  };
}

const cases = { streamChat, embeddings, errors, vercelParts, tools };
process.stdout.write(JSON.stringify(await cases[name]()));
