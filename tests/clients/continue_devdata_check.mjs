// Checks Continue development-data events against the zod schemas Continue itself publishes
// (@continuedev/config-yaml, pinned in flywheel/clients_npm): one JSON event per line on stdin, as Continue
// POSTs it ({name, data, schema, level}); one JSON line out per event: {"ok": true} or {"ok": false, "issues"}.
// Unknown keys are refused (strict), so an event the tests build carries nothing Continue would not send.
// Usage: node continue_devdata_check.mjs <node_modules dir>
import { createInterface } from "node:readline";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const pkg = join(process.argv[2], "@continuedev", "config-yaml", "dist", "index.js");
const { devDataVersionedSchemas } = await import(pathToFileURL(pkg).href);

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (!line.trim()) continue;
  const event = JSON.parse(line);
  const schema = devDataVersionedSchemas[event.schema]?.[event.level ?? "all"]?.[event.name];
  if (!schema) {
    console.log(JSON.stringify({ ok: false, issues: [`no schema for ${event.name}@${event.schema}`] }));
    continue;
  }
  const res = schema.strict().safeParse(event.data);
  const issues = res.success ? [] : res.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
  console.log(JSON.stringify({ ok: res.success, issues }));
}
