// Parse Mermaid diagrams with mermaid's own parser: the major version the Material theme
// draws them with (mermaid@11), so a diagram that passes here is drawn on the site.
//
// stdin: a JSON array of {"where": ..., "text": ...}; stdout: a JSON array of
// {"where": ..., "type": <the diagram type> | null, "error": <message> | null}.
// mermaid.parse needs a DOM only for DOMPurify's window: jsdom gives it one.
import { JSDOM } from "jsdom";

const { window } = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.window = window;
globalThis.document = window.document;
const { default: mermaid } = await import("mermaid");
mermaid.initialize({ startOnLoad: false });

let input = "";
for await (const chunk of process.stdin) input += chunk;
const results = [];
for (const { where, text } of JSON.parse(input)) {
  try {
    const parsed = await mermaid.parse(text);
    results.push({ where, type: parsed.diagramType, error: null });
  } catch (error) {
    results.push({ where, type: null, error: String(error?.message ?? error) });
  }
}
process.stdout.write(JSON.stringify(results));
