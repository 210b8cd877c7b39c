// Generates src/schema.ts from the service's openapi.json with openapi-typescript, or, with
// --check, generates it into a temporary folder and fails when it differs from the committed one.
//
// One script for both, so the check runs the generator with exactly the arguments `generate` does.
// The output is deterministic: the generator is pinned in package-lock.json and writes no date.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const spec = join(root, "..", "..", "openapi.json");
const target = join(root, "src", "schema.ts");
const cli = join(root, "node_modules", "openapi-typescript", "bin", "cli.js");
// Properties with a default stay optional, so request types take what the service defaults.
const OPTIONS = ["--default-non-nullable", "false"];

function generate(output) {
  const run = spawnSync(process.execPath, [cli, spec, ...OPTIONS, "--output", output], {
    cwd: root,
    encoding: "utf8",
  });
  if (run.status !== 0) {
    process.stderr.write(run.stdout + run.stderr);
    process.exit(run.status ?? 1);
  }
}

if (process.argv.includes("--check")) {
  const folder = mkdtempSync(join(tmpdir(), "jobq-schema-"));
  try {
    const fresh = join(folder, "schema.ts");
    generate(fresh);
    if (readFileSync(fresh, "utf8") !== readFileSync(target, "utf8")) {
      process.stderr.write(
        `${relative(root, target)} differs from what openapi-typescript generates from ` +
          `openapi.json: run \`npm run generate\` and commit the result\n`,
      );
      process.exit(1);
    }
    process.stdout.write(`${relative(root, target)} matches openapi.json\n`);
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
} else {
  generate(target);
  process.stdout.write(`wrote ${relative(root, target)}\n`);
}
