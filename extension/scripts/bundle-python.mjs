// Runs scripts/bundle_python.py with the project's Python: $EKKA_PYTHON, else the repository's .venv, else python3.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const ext = dirname(dirname(fileURLToPath(import.meta.url)));
const venv = join(ext, "..", ".venv", process.platform === "win32" ? "Scripts/python.exe" : "bin/python");
const python = process.env.EKKA_PYTHON || (existsSync(venv) ? venv : "python3");
const r = spawnSync(python, [join(ext, "scripts", "bundle_python.py")], { stdio: "inherit" });
if (r.error) {
  console.error(`[bundle-python] cannot run ${python}: ${r.error.message}`);
  process.exit(2);
}
process.exit(r.status ?? 1);
