// End-to-end: the packaged extension in real VS Code (code-server 4.100.3) in headless Debian Chromium.
// Run through scripts/e2e.sh (setup + packaging first). Every check reads the workbench's DOM.
//
// Scenario: a workspace with demo.ekka.toml (the demo's tiny Gemma 3 from `ekka zoo gemma3_text` and the demo's
// prompts; its out dir reuses traces captured once by `ekka demo`, and the extension forwards EKKA_INJECT_BUG so
// the trace fingerprint matches) → right-click the spec in the Explorer → "Diagnose silent error" → the
// progress notification (with Cancel) → the "Silent errors" tree shows "Served configuration: …" above
// "#1 Attention …" → clicking it opens vLLM's attention.py at the class line with the error squiggle and the code
// lens → the hover shows the table → the code lens opens the webview with the plots → the "called from" row opens
// gemma3.py at the call line.
// Then an inconclusive diagnosis (issues 22/23): inconclusive.ekka.toml (the tiny Llama) diagnosed by an engine that
// cannot map any component — the mapping rules, the knowledge base and the agent switched off (EKKA_MAPPING_RULES=off,
// EKKA_KNOWLEDGE_BASE=off, EKKA_AGENT=0; its traces captured once beforehand, like the demo's) → the Silent errors
// view shows "Verdict: inconclusive" (a warning), "Not observed" and "Not checked (N)", the status bar and the
// divergence page the server's headline "inconclusive: could not observe modules"; screenshot
// media/inconclusive-view.png. The switches reach only that job's engine through ekka.interpreter, switched to a
// wrapper that sets them: the extension forwards no EKKA_* variable but EKKA_INJECT_BUG (diagnosis.ts FORWARDED_ENV),
// and the extension host's environment — which the server and its engines inherit — is the demo's too.
import { spawn, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const e2eDir = process.env.EKKA_E2E_DIR || path.join(root, "build", "e2e");
const codeServer = path.join(e2eDir, "node_modules", ".bin", "code-server");
const vsix = path.join(root, "extension", "ekka.vsix");
const python = path.join(root, ".venv", "bin", "python");
const ekka = path.join(root, ".venv", "bin", "ekka");
// Screenshots go to build/e2e/screenshots; EKKA_E2E_SCREENSHOTS=media refreshes the committed ones in media/.
const media = process.env.EKKA_E2E_SCREENSHOTS ? path.resolve(root, process.env.EKKA_E2E_SCREENSHOTS)
  : path.join(root, "build", "e2e", "screenshots");
const BUG = "gemma3-sliding-window-every-layer";
const LIMIT_MS = 420_000;

const t0 = Date.now();
const timings = [];
const secs = () => ((Date.now() - t0) / 1000).toFixed(1);
function step(name) {
  timings.push([name, Date.now()]);
  console.log(`[e2e ${secs()}s] ${name}`);
}
function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`  ✓ ${what}`);
}

function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", ...opts });
  if (r.error) throw r.error;
  return r;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** TOML for a DiagnosisSpec dict (strings as JSON strings are valid TOML basic strings). */
function toToml(spec) {
  const value = (v) => {
    if (typeof v === "string") return JSON.stringify(v);
    if (typeof v === "number" || typeof v === "boolean") return String(v);
    if (Array.isArray(v)) return `[${v.map(value).join(", ")}]`;
    if (v && typeof v === "object") return `{ ${Object.entries(v).map(([k, x]) => `${k} = ${value(x)}`).join(", ")} }`;
    throw new Error(`cannot write ${JSON.stringify(v)} as TOML`);
  };
  return Object.entries(spec)
    .filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => `${k} = ${value(v)}`)
    .join("\n") + "\n";
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "ekka-e2e-"));
const ws = path.join(tmp, "ws");
const userData = path.join(tmp, "user-data");
const extDir = path.join(tmp, "extensions");
let server;
let browser;
let page;

async function main() {
  for (const f of [codeServer, vsix, python, ekka]) {
    if (!fs.existsSync(f)) throw new Error(`${f} is missing (run scripts/e2e.sh, which sets up and packages)`);
  }
  fs.mkdirSync(media, { recursive: true });

  // 1. the diagnosis, captured once (ekka demo reuses its traces when nothing changed)
  step("pre-running the demo diagnosis (ekka demo)");
  const demoOut = path.join(e2eDir, "demo-out");
  const demo = run(ekka, ["demo", "--out", demoOut], { cwd: root });
  if (demo.status !== 1) {
    throw new Error(`ekka demo exited ${demo.status} (want 1: divergent)\n${demo.stdout}\n${demo.stderr}`);
  }
  const demoReport = JSON.parse(fs.readFileSync(path.join(demoOut, "report.json"), "utf8"));
  check(demoReport.verdict === "divergent" && demoReport.suspects[0].target.class === "Attention", "the demo finds #1 Attention");

  // 2. the workspace: the spec (zoo model + demo prompts), its out dir reusing the demo's traces
  step("creating the workspace");
  const zooModel = run(ekka, ["zoo", "gemma3_text"], { cwd: root }).stdout.trim().split("\n").pop();
  check(zooModel === demoReport.spec.model, `spec model is \`ekka zoo gemma3_text\` (${zooModel})`);
  fs.mkdirSync(path.join(ws, "ekka-out"), { recursive: true });
  fs.mkdirSync(path.join(ws, ".vscode"));
  fs.symlinkSync(demoOut, path.join(ws, "ekka-out", "demo"));
  fs.writeFileSync(
    path.join(ws, "demo.ekka.toml"),
    "# Gemma 3 (tiny, random weights) with vLLM's sliding-window bug re-injected (EKKA_INJECT_BUG)\n" +
      toToml({ ...demoReport.spec, model: zooModel }),
  );
  fs.writeFileSync(path.join(ws, ".vscode", "settings.json"), JSON.stringify({ "ekka.interpreter": python }, null, 1));

  // 2b. the inconclusive spec: the tiny Llama, no component mapped (the rules, the knowledge base and the agent off);
  // its traces captured once here (the engine forwards EKKA_INJECT_BUG to every job, so the traces are captured with
  // it too, and reused by the editor's job)
  step("pre-running the inconclusive diagnosis (ekka diagnose, exit 4)");
  const blindEnv = { EKKA_MAPPING_RULES: "off", EKKA_KNOWLEDGE_BASE: "off", EKKA_AGENT: "0" };
  const blindPython = path.join(tmp, "python-unmapped");
  fs.writeFileSync(blindPython, "#!/bin/sh\n# the engine with no component mapped: an inconclusive diagnosis\n" +
    `export ${Object.entries(blindEnv).map(([k, v]) => `${k}='${v}'`).join(" ")}\nexec '${python}' "$@"\n`, { mode: 0o755 });
  const llama = run(ekka, ["zoo", "llama"], { cwd: root }).stdout.trim().split("\n").pop();
  const incSpec = path.join(ws, "inconclusive.ekka.toml");
  fs.writeFileSync(incSpec, "# the tiny Llama; the engine here cannot map any component (an inconclusive diagnosis)\n" +
    toToml({ model: llama, prompts: ["hi"], max_new_tokens: 2, engine_args: { enforce_eager: true } }));
  const incOut = path.join(e2eDir, "inconclusive-out");
  const inc = run(ekka, ["diagnose", "--spec", incSpec, "--out", incOut], {
    cwd: root, env: { ...process.env, ...blindEnv, EKKA_INJECT_BUG: BUG },
  });
  if (inc.status !== 4) {
    throw new Error(`ekka diagnose (inconclusive) exited ${inc.status} (want 4: inconclusive)\n${inc.stdout}\n${inc.stderr}`);
  }
  const incReport = JSON.parse(fs.readFileSync(path.join(incOut, "report.json"), "utf8"));
  check(incReport.verdict === "inconclusive" && incReport.missing.length > 0 && incReport.unchecked.length > 0,
    `ekka diagnose: inconclusive, ${incReport.unchecked.length} components not checked`);
  // what the server's job message and headline say of it (short_headline: the checks that could not observe)
  const incHeadline = "inconclusive: could not observe modules";
  check(incReport.checks.filter((c) => c.status === "inconclusive").map((c) => c.check).join() === "modules",
    "the modules check is the one that could not observe");
  fs.symlinkSync(incOut, path.join(ws, "ekka-out", "inconclusive"));
  fs.mkdirSync(path.join(userData, "User"), { recursive: true });
  fs.writeFileSync(
    path.join(userData, "User", "settings.json"),
    JSON.stringify(
      {
        "workbench.startupEditor": "none",
        "security.workspace.trust.enabled": false,
        "telemetry.telemetryLevel": "off",
        "extensions.autoUpdate": false,
        "extensions.autoCheckUpdates": false,
        "extensions.ignoreRecommendations": true,
        "update.mode": "none",
        "workbench.tips.enabled": false,
        "workbench.enableExperiments": false,
        "editor.hover.delay": 150,
        "editor.minimap.enabled": false,
        "window.restoreWindows": "none",
        "git.enabled": false,
        "git.openRepositoryInParentFolders": "never",
      },
      null,
      1,
    ),
  );

  // 3. the packaged extension, installed the way a user would
  step("installing extension/ekka.vsix into a fresh extensions dir");
  const inst = run(codeServer, ["--install-extension", vsix, "--extensions-dir", extDir, "--user-data-dir", userData]);
  check(inst.status === 0 && /successfully installed/i.test(inst.stdout + inst.stderr), "code-server --install-extension ekka.vsix");
  const installed = fs.readdirSync(extDir).find((d) => d.startsWith("ekka.ekka-"));
  check(installed && fs.existsSync(path.join(extDir, installed, "bundled", "tool", "lsp_server.py")), "the installed extension carries bundled/tool/lsp_server.py");

  // 4. code-server
  step("starting code-server");
  const port = await freePort();
  server = spawn(
    codeServer,
    ["--auth", "none", "--bind-addr", `127.0.0.1:${port}`, "--disable-telemetry", "--disable-update-check",
      "--disable-workspace-trust", "--user-data-dir", userData, "--extensions-dir", extDir, ws],
    {
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, EKKA_INJECT_BUG: BUG, VSCODE_IPC_HOOK_CLI: "" },
    },
  );
  let serverLog = "";
  server.stdout.on("data", (d) => (serverLog += d));
  server.stderr.on("data", (d) => (serverLog += d));
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`code-server did not start:\n${serverLog}`)), 60_000);
    const onData = () => {
      const m = /HTTP server listening on (http:\/\/[^\s]+)/.exec(serverLog);
      if (m) {
        clearTimeout(timer);
        resolve(m[1].replace(/\/$/, ""));
      }
    };
    server.stdout.on("data", onData);
    server.stderr.on("data", onData);
    server.on("exit", (code) => reject(new Error(`code-server exited (${code}):\n${serverLog}`)));
  });

  // 5. the browser
  step("opening the workbench in headless chromium");
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  await page.goto(`${url}/?folder=${encodeURIComponent(ws)}`);
  await page.waitForSelector(".monaco-workbench", { timeout: 60_000 });
  const explorerRow = page.locator(".explorer-folders-view .monaco-list-row", { hasText: "demo.ekka.toml" });
  await explorerRow.waitFor({ timeout: 60_000 });
  check(true, "the Explorer lists demo.ekka.toml");

  step("waiting for the Ekka language server");
  const ready = page.locator(".statusbar-item", { has: page.locator(".codicon-beaker") });
  const broken = page.locator(".statusbar-item", { has: page.locator(".codicon-warning") }).filter({ hasText: "Ekka" });
  await Promise.race([
    ready.first().waitFor({ timeout: 60_000 }),
    broken.first().waitFor({ timeout: 60_000 }).then(() => {
      throw new Error("the Ekka status bar item shows a warning: the server did not start");
    }),
  ]);
  check((await ready.first().innerText()).includes("Ekka"), "status bar: Ekka ready (beaker)");

  // 6. right-click → Diagnose silent error
  step("Explorer context menu → Diagnose silent error");
  await diagnoseFromExplorer(explorerRow, "demo.ekka.toml");

  const toast = page.locator(".notification-toast", { hasText: "Ekka: diagnosing demo.ekka.toml" });
  await toast.waitFor({ timeout: 20_000 });
  check(true, "progress notification “Ekka: diagnosing demo.ekka.toml”");
  check(await toast.locator(".monaco-button", { hasText: "Cancel" }).count() === 1, "the notification has a Cancel button");
  const running = page.locator(".statusbar-item", { has: page.locator(".codicon-sync") }).filter({ hasText: "Ekka" });
  await running.first().waitFor({ timeout: 10_000 }).catch(() => undefined);
  await page.waitForTimeout(400); // let the toast finish sliding in
  await page.screenshot({ path: path.join(media, "e2e-progress.png") });
  check((await running.count()) > 0 || (await toast.count()) > 0, "status bar shows the running job");

  // 7. the Silent errors tree
  step("waiting for the diagnosis → Silent errors tree");
  const top = page.locator('.monaco-list-row[aria-label^="#1 Attention"]');
  await top.waitFor({ timeout: 150_000 });
  const topText = await top.innerText();
  // the description is the finding's summary, as the report words it
  check(/#1 Attention/.test(topText) && topText.includes(demoReport.suspects[0].summary), `tree row: “${topText.replace(/\s+/g, " ")}”`);
  const verdictRow = page.locator('.monaco-list-row[aria-label^="Verdict: divergent"]');
  check(await verdictRow.count() === 1, `tree row: “${(await verdictRow.getAttribute("aria-label")) ?? "none"}”`);
  check(await page.locator(".pane-header", { hasText: /Silent errors/i }).count() > 0, "the view is titled “Silent errors”");
  // the report's `serving` section: a "Served configuration" row above the suspects
  check(Boolean(demoReport.serving), "the demo report has a serving section (the served configuration's check)");
  const servingRow = page.locator('.monaco-list-row[aria-label^="Served configuration: "]');
  const servingRows = await servingRow.count();
  check(servingRows === 1, `tree row: “${servingRows ? await servingRow.getAttribute("aria-label") : "none"}”`);
  const [verdictBox, servingBox, topBox] = [await verdictRow.boundingBox(), await servingRow.boundingBox(), await top.boundingBox()];
  check(verdictBox && servingBox && topBox && verdictBox.y < servingBox.y && servingBox.y < topBox.y,
    "the Verdict row is first, the Served configuration row above #1 Attention");
  const second = page.locator('.monaco-list-row[aria-label^="#2 "]');
  check(await second.count() === 1, `a #2 suspect is listed (${(await second.getAttribute("aria-label")) ?? "?"})`);
  await toast.waitFor({ state: "detached", timeout: 15_000 });
  check(true, "the progress notification closed");
  const bug = page.locator(".statusbar-item", { has: page.locator(".codicon-bug") });
  check((await bug.first().innerText()).includes("#1 Attention"), `status bar: “${(await bug.first().innerText()).trim()}”`);
  await page.screenshot({ path: path.join(media, "e2e-tree.png") });

  // 8. click → attention.py at the class line, squiggle, code lens
  step("clicking #1 Attention → the engine's source");
  const classLine = demoReport.suspects[0].target.line;
  await top.click();
  await page.locator(".tab", { hasText: "attention.py" }).waitFor({ timeout: 20_000 });
  check(true, "editor tab attention.py opened");
  const editor = page.locator(".editor-group-container.active .monaco-editor").first();
  const activeLine = editor.locator(".line-numbers.active-line-number");
  await activeLine.first().waitFor({ timeout: 10_000 });
  check((await activeLine.first().innerText()).trim() === String(classLine), `cursor on line ${classLine} (class Attention)`);
  const classRow = editor.locator(".view-line", { hasText: /^\s*class\s+Attention\b/ });
  check(await classRow.count() === 1, "the line shows `class Attention(...)`");
  const squiggle = editor.locator(".squiggly-error");
  await squiggle.first().waitFor({ timeout: 20_000 });
  check(await squiggle.count() >= 1, "error squiggle (rank 1 diagnostic) in attention.py");
  const lens = editor.locator(".codelens-decoration", { hasText: "Ekka #1" });
  await lens.first().waitFor({ timeout: 20_000 });
  check(/Show divergence/.test(await lens.first().innerText()), `code lens: “${(await lens.first().innerText()).trim()}”`);
  // the squiggle sits on the class line: same vertical band as the class line
  const lineBox = await classRow.boundingBox();
  const squiggleBoxes = await Promise.all((await squiggle.all()).map((s) => s.boundingBox()));
  check(squiggleBoxes.some((b) => b && Math.abs(b.y - lineBox.y) < lineBox.height), "the squiggle is on the class line");
  await page.screenshot({ path: path.join(media, "e2e-editor.png") });

  // 9. hover on the class line
  step("hovering the class line");
  const nameSpan = classRow.locator("span", { hasText: /^Attention$/ }).first();
  const hb = (await nameSpan.count()) ? await nameSpan.boundingBox() : lineBox;
  await page.mouse.move(hb.x + Math.min(20, hb.width / 2), hb.y + hb.height / 2);
  const hover = page.locator(".monaco-hover", { hasText: "Ekka" }).filter({ has: page.locator("table") });
  await hover.first().waitFor({ state: "visible", timeout: 15_000 });
  const hoverText = await hover.first().innerText();
  check(/model\.layers\.3\.self_attn\.attn/.test(hoverText), "hover table lists model.layers.3.self_attn.attn");
  check(/error ratio/.test(hoverText) && /suspect/.test(hoverText), "hover shows the suspect and the error-ratio column");
  await page.screenshot({ path: path.join(media, "e2e-hover.png") });
  await page.mouse.move(5, 450);
  await page.keyboard.press("Escape");

  // 10. code lens → webview with the plots
  step("code lens → Ekka: Show divergence (webview)");
  await lens.first().locator("a", { hasText: "Show divergence" }).click();
  const frame = page.frameLocator("iframe.webview.ready").frameLocator("#active-frame");
  await frame.locator("#series-plot").waitFor({ timeout: 20_000 });
  check(true, "webview shows the error-ratio plot (#series-plot)");
  const cpLabel = (await frame.locator(".change-point-label").textContent())?.trim();
  check(cpLabel === `change point: ${demoReport.suspects[0].target.module}`, `change point line labelled “${cpLabel}”`);
  check(await frame.locator("#threshold-line").count() === 1, "threshold line drawn");
  const labels = await frame.locator("#series-plot text.tick").allTextContents();
  check(labels.includes("1") && labels.includes("10"), `log-scale decade ticks (${labels.join(", ")})`);
  const cells = await frame.locator("#heatmap-plot rect.cell").count();
  check(cells > 0, `heat map drawn (${cells} cells)`);
  check(await frame.locator("circle.highlight").count() === 1, "the code lens's module is ringed");
  check((await frame.locator("#verdict").innerText()).startsWith("Divergent — #1 Attention"), "webview heading: Divergent — #1 Attention");
  const plotBox = await frame.locator("#series-plot").boundingBox();
  const bodyWidth = await frame.locator("body").evaluate((b) => b.clientWidth);
  check(plotBox && plotBox.width <= bodyWidth + 1, "the plot fits the panel's width");
  await page.screenshot({ path: path.join(media, "e2e-webview.png") });

  // 11. the call-site row
  step("tree: “called from” → the call site");
  const call = demoReport.suspects[0].target;
  const callRow = page.locator(`.monaco-list-row[aria-label="call site ${path.basename(call.call_file)}:${call.call_line}"]`);
  await callRow.click();
  await page.locator(".tab", { hasText: path.basename(call.call_file) }).waitFor({ timeout: 20_000 });
  const callEditor = page.locator(".editor-group-container.active .monaco-editor").first();
  const callActive = callEditor.locator(".line-numbers.active-line-number").first();
  await callActive.waitFor({ timeout: 10_000 });
  check((await callActive.innerText()).trim() === String(call.call_line), `${path.basename(call.call_file)} opened at the call line ${call.call_line}`);
  await page.screenshot({ path: path.join(media, "e2e-callsite.png") });

  // 12. the command palette lists the Ekka commands
  step("command palette: Ekka commands");
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget .quick-input-box input");
  await input.waitFor({ timeout: 10_000 });
  await input.fill(">Ekka: ");
  const rows = page.locator(".quick-input-widget .quick-input-list .monaco-list-row");
  await rows.first().waitFor({ timeout: 10_000 });
  await page.waitForTimeout(300);
  const entries = (await rows.allInnerTexts()).map((t) => t.split("\n")[0].trim());
  for (const want of ["Ekka: Diagnose silent error", "Ekka: Show divergence", "Ekka: Set Anthropic API key", "Ekka: Restart Server"]) {
    check(entries.some((e) => e.startsWith(want)), `palette offers “${want}”`);
  }
  check(!entries.some((e) => e.startsWith("Ekka: Open source")), "internal commands are not in the palette");
  await page.keyboard.press("Escape");

  // 13. an inconclusive diagnosis: the engine (a wrapper interpreter setting blindEnv) cannot map any component
  step("ekka.interpreter → the wrapper that maps nothing (the server restarts)");
  const spinning = page.locator(".statusbar-item", { has: page.locator(".codicon-sync") }).filter({ hasText: "Ekka" });
  fs.writeFileSync(path.join(ws, ".vscode", "settings.json"), JSON.stringify({ "ekka.interpreter": blindPython }, null, 1));
  await spinning.first().waitFor({ timeout: 15_000 }).catch(() => undefined); // the restart may be quicker than a poll
  await spinning.first().waitFor({ state: "detached", timeout: 60_000 });
  await page.locator(".statusbar-item", { has: page.locator(".codicon-bug") }).first().waitFor({ timeout: 30_000 });
  check(true, "the server restarted (status bar back to the last job)");

  step("Explorer context menu → Diagnose silent error on inconclusive.ekka.toml");
  const incRow = page.locator(".explorer-folders-view .monaco-list-row", { hasText: "inconclusive.ekka.toml" });
  if (!(await incRow.isVisible())) {
    // the Silent errors view took the side bar: back to the Explorer (its activity bar item, else its key binding)
    const explorer = page.locator(".activitybar .action-item .action-label[aria-label^='Explorer']").first();
    if (await explorer.count()) await explorer.click();
    else await page.keyboard.press("Control+Shift+E");
  }
  await incRow.waitFor({ timeout: 20_000 });
  await diagnoseFromExplorer(incRow, "inconclusive.ekka.toml");
  await page.locator(".notification-toast", { hasText: "Ekka: diagnosing inconclusive.ekka.toml" }).waitFor({ timeout: 20_000 });
  check(true, "progress notification “Ekka: diagnosing inconclusive.ekka.toml”");

  step("waiting for the inconclusive report → Silent errors tree");
  const incVerdict = page.locator('.monaco-list-row[aria-label^="Verdict: inconclusive"]');
  await incVerdict.waitFor({ timeout: 120_000 });
  check(await incVerdict.locator(".codicon-warning").count() === 1, `tree row: “${await incVerdict.getAttribute("aria-label")}” (a warning icon)`);
  const notObserved = page.locator('.monaco-list-row[aria-label^="Not observed"]');
  check(await notObserved.count() === 1, "a “Not observed” node");
  const missingRow = page.locator(`.monaco-list-row[aria-label="${incReport.missing[0].replace(/"/g, '\\"')}"]`);
  check(await missingRow.count() === 1, "under it, what was not observed and the fix, in the report's words");
  const notChecked = page.locator(`.monaco-list-row[aria-label="Not checked (${incReport.unchecked.length})"]`);
  check(await notChecked.count() === 1, `a “Not checked (${incReport.unchecked.length})” node`);
  const modulesCheck = page.locator('.monaco-list-row[aria-label^="? modules: inconclusive"]');
  check(await modulesCheck.count() === 1, "the Checks node lists “? modules: inconclusive — …”");
  check(await page.locator('.monaco-list-row[aria-label^="#1 "]').count() === 0, "no suspect is listed");
  const incStatus = page.locator(".statusbar-item", { has: page.locator(".codicon-warning") })
    .filter({ hasText: `Ekka: ${incHeadline}` });
  await incStatus.first().waitFor({ timeout: 15_000 });
  check(true, `status bar: “${(await incStatus.first().innerText()).trim()}”`);
  // a wider side bar for the screenshot, so that the rows' texts show (drag the sash at its right edge)
  const side = await page.locator(".part.sidebar").boundingBox();
  if (side) {
    await page.mouse.move(side.x + side.width - 1, side.y + side.height / 2);
    await page.mouse.down();
    await page.mouse.move(side.x + side.width + 420, side.y + side.height / 2, { steps: 8 });
    await page.mouse.up();
  }
  await page.mouse.move(5, 5);
  await page.waitForTimeout(300);
  await page.screenshot({ path: path.join(media, "e2e-inconclusive.png") });
  await page.screenshot({ path: path.join(root, "media", "inconclusive-view.png") });
  await notChecked.click();
  const firstUnchecked = incReport.unchecked[0];
  const uncheckedRow = page.locator(`.monaco-list-row[aria-label="${firstUnchecked.module}: ${firstUnchecked.reason}"]`);
  await uncheckedRow.waitFor({ timeout: 10_000 });
  check(true, `“Not checked” unfolds to one row per component (“${firstUnchecked.module}: ${firstUnchecked.reason}”)`);
  check(await page.locator(".editor-group-container.active .monaco-editor .squiggly-error").count() === 0,
    "no error squiggle: an inconclusive report blames no source line");

  step("command palette: Ekka: Show divergence → the inconclusive report's page");
  await page.keyboard.press("F1");
  await input.waitFor({ timeout: 10_000 });
  await input.fill(">Ekka: Show divergence");
  await rows.first().waitFor({ timeout: 10_000 });
  await page.waitForTimeout(300);
  await page.keyboard.press("Enter");
  const heading = frame.locator("#verdict.verdict-inconclusive");
  await heading.waitFor({ timeout: 20_000 });
  check((await heading.innerText()).trim() === incHeadline, `webview heading: “${incHeadline}” (the server's headline)`);
}

/** Right-click `row` in the Explorer → "Diagnose silent error". */
async function diagnoseFromExplorer(row, name) {
  await row.click({ button: "right" });
  const menuItem = page.locator(".context-view .action-label", { hasText: "Diagnose silent error" });
  await menuItem.waitFor({ timeout: 15_000 });
  check(true, `the Explorer context menu offers “Diagnose silent error” on ${name}`);
  // VS Code's web menus act on mouseup after a hover; a plain click right after the menu opens can be lost.
  await menuItem.hover();
  await page.waitForTimeout(300);
  await menuItem.click();
  const closed = await menuItem.waitFor({ state: "hidden", timeout: 2_000 }).then(() => true, () => false);
  if (!closed) await page.keyboard.press("Enter"); // the click was lost; the hovered item is the focused one
}

function dumpLogs() {
  const logs = path.join(userData, "logs");
  if (!fs.existsSync(logs)) return;
  const walk = (d) => fs.readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(path.join(d, e.name)) : [path.join(d, e.name)]));
  for (const f of walk(logs).filter((f) => /Ekka|exthost\.log|remoteexthost/.test(f))) {
    const text = fs.readFileSync(f, "utf8");
    console.error(`----- ${path.relative(tmp, f)} (last 60 lines) -----\n${text.split("\n").slice(-60).join("\n")}`);
  }
}

async function cleanup() {
  try {
    await browser?.close();
  } catch {
    // already gone
  }
  if (server?.pid !== undefined && server.exitCode === null) {
    try {
      process.kill(-server.pid, "SIGTERM"); // code-server was started in its own process group
    } catch {
      // exited meanwhile
    }
    await new Promise((r) => setTimeout(r, 1500));
    try {
      process.kill(-server.pid, "SIGKILL");
    } catch {
      // exited on SIGTERM
    }
  }
  if (process.env.EKKA_E2E_KEEP) console.log(`kept ${tmp}`);
  else fs.rmSync(tmp, { recursive: true, force: true });
}

const guard = setTimeout(() => {
  console.error(`[e2e] timed out after ${LIMIT_MS / 1000} s`);
  process.exitCode = 1;
  cleanup().finally(() => process.exit(1));
}, LIMIT_MS);

let failed = false;
try {
  await main();
} catch (err) {
  failed = true;
  console.error(`[e2e ${secs()}s] FAILED: ${err instanceof Error ? err.stack : err}`);
  try {
    const shot = path.join(e2eDir, "failure.png");
    await page?.screenshot({ path: shot });
    console.error(`screenshot of the failure: ${shot}`);
  } catch {
    // no page
  }
  dumpLogs();
} finally {
  clearTimeout(guard);
  await cleanup();
}
timings.push(["end", Date.now()]);
console.log(
  "[e2e] timings: " +
    timings.slice(0, -1).map(([n, t], i) => `${n} ${((timings[i + 1][1] - t) / 1000).toFixed(1)}s`).join("; "),
);
console.log(`[e2e] ${failed ? "FAILED" : "passed"} in ${secs()} s`);
process.exit(failed ? 1 : 0);
