// Runs the Vercel AI SDK's default OpenAI provider against the gateway, once with
// streamText and once with generateText, and prints one JSON line per run:
//   {"text": ..., "finishReason": ..., "usage": ...}
//
// Environment:
//   GATEWAY_URL     the gateway's OpenAI base URL, e.g. http://127.0.0.1:8080/v1
//   MODEL           the model for streamText (e.g. a chaos spec that breaks the stream)
//   GENERATE_MODEL  the model for generateText; defaults to MODEL
//
// Exits non-zero, with the error on stderr, if either run fails, ends without
// finishing, or talks to anything but POST {GATEWAY_URL}/responses.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

const gatewayUrl = required("GATEWAY_URL").replace(/\/+$/, "");
const streamModel = required("MODEL");
const generateModel = process.env.GENERATE_MODEL || streamModel;

// Only watches: every request the provider makes must be POST {GATEWAY_URL}/responses,
// the Responses API, which is what the default `openai(model)` uses.
const requests = [];
async function watchingFetch(input, init) {
  const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
  const method = init?.method ?? (typeof input === "object" && "method" in input ? input.method : "GET");
  requests.push(`${method} ${url}`);
  return fetch(input, init);
}

const openai = createOpenAI({ baseURL: gatewayUrl, apiKey: "k", fetch: watchingFetch });

function checkRequests(what) {
  const expected = `POST ${gatewayUrl}/responses`;
  const wrong = requests.filter((r) => r !== expected);
  if (requests.length !== 1 || wrong.length) {
    throw new Error(`${what}: expected exactly one ${expected}, made: ${JSON.stringify(requests)}`);
  }
  requests.length = 0;
}

function checkFinished(what, finishReason) {
  // The AI SDK reports a stream that ended without a terminal event as "interrupted"
  // (or "other"/"error"), without throwing: a whole answer ends in "stop".
  if (finishReason !== "stop") throw new Error(`${what}: finishReason is ${JSON.stringify(finishReason)}`);
}

async function checkStream() {
  let streamError;
  const result = streamText({
    model: openai(streamModel),
    prompt: "Tell me.",
    // No SDK-side retries: only the gateway may recover the answer.
    maxRetries: 0,
    // streamText never throws from textStream: errors only reach onError.
    onError: ({ error }) => {
      streamError ??= error;
    },
  });
  let text = "";
  for await (const delta of result.textStream) text += delta;
  if (streamError !== undefined) throw streamError;
  const [finishReason, usage] = await Promise.all([result.finishReason, result.totalUsage]);
  checkRequests("streamText");
  checkFinished("streamText", finishReason);
  return { text, finishReason, usage };
}

async function checkGenerate() {
  const result = await generateText({
    model: openai(generateModel),
    prompt: "Tell me.",
    maxRetries: 0,
  });
  checkRequests("generateText");
  checkFinished("generateText", result.finishReason);
  return { text: result.text, finishReason: result.finishReason, usage: result.totalUsage };
}

try {
  for (const check of [checkStream, checkGenerate]) {
    process.stdout.write(`${JSON.stringify(await check())}\n`);
  }
} catch (error) {
  console.error(error);
  process.exitCode = 1;
}
