// Builds the extension bundle (default) or the unit-test bundles (--tests).
//   node esbuild.mjs            -> dist/extension.js   (what VS Code loads)
//   node esbuild.mjs --tests    -> out-test/*.test.js  (run with `node --test out-test/`)
// `vscode` never exists on disk: VS Code injects it at run time, and the tests replace it
// (and vscode-languageclient) with mocks through Module._load, so both stay external there.
import { build } from "esbuild";
import { readdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(fileURLToPath(import.meta.url));
const tests = process.argv.includes("--tests");

const common = {
  absWorkingDir: root,
  bundle: true,
  platform: "node",
  format: "cjs",
  target: "node20",
  sourcemap: true,
  logLevel: "warning",
};

if (tests) {
  const outdir = join(root, "out-test");
  rmSync(outdir, { recursive: true, force: true }); // no stale test files from renamed tests
  const entryPoints = readdirSync(join(root, "test"))
    .filter((f) => f.endsWith(".test.ts"))
    .map((f) => `test/${f}`);
  if (entryPoints.length === 0) throw new Error("no test/*.test.ts files found");
  await build({
    ...common,
    entryPoints,
    outdir,
    external: ["vscode", "vscode-languageclient", "vscode-languageclient/*"],
  });
} else {
  await build({
    ...common,
    entryPoints: ["src/extension.ts"],
    outfile: join(root, "dist", "extension.js"),
    external: ["vscode"],
    minify: process.argv.includes("--minify"),
  });
}
