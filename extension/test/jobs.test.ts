// Job states → status bar and the progress notification; Cancel in the notification → the cancel callback.
import assert from "node:assert/strict";
import { beforeEach, describe, test } from "node:test";
import { installModuleMocks } from "./mocks/install";
import { ProgressLocation, mock, resetVscodeMock, vscodeModule } from "./mocks/vscode";
import type { JobState } from "../src/protocol";

installModuleMocks({ vscode: vscodeModule });
const jobs: typeof import("../src/jobs") = require("../src/jobs");

const state = (over: Partial<JobState>): JobState => ({ jobId: "j1", state: "running", stage: null, ...over });
const tick = () => new Promise((r) => setImmediate(r));

beforeEach(() => resetVscodeMock());

describe("statusFor", () => {
  test("idle, running with stage and percent, done, failed, cancelled", () => {
    assert.equal(jobs.statusFor(undefined).text, "$(beaker) Ekka");
    assert.equal(jobs.statusFor(state({ state: "queued" })).text, "$(sync~spin) Ekka: starting");
    assert.equal(jobs.statusFor(state({ stage: "capture", percent: 35 })).text, "$(sync~spin) Ekka: capture 35%");
    assert.equal(
      jobs.statusFor(state({ state: "done", verdict: "divergent" }), "#1 Attention · 49.7× · from token 16").text,
      "$(bug) Ekka: #1 Attention · 49.7× · from token 16",
    );
    assert.equal(jobs.statusFor(state({ state: "done", verdict: "consistent" }), "consistent").text, "$(check) Ekka: consistent");
    const failed = jobs.statusFor(state({ state: "failed", error: { message: "model path x does not exist", exit_code: 2 } }));
    assert.equal(failed.text, "$(error) Ekka: failed");
    assert.match(failed.tooltip, /model path x does not exist/);
    assert.equal(jobs.statusFor(state({ state: "cancelled" })).text, "$(circle-slash) Ekka: cancelled");
  });

  test("progress messages", () => {
    assert.equal(jobs.progressMessage(state({ state: "queued" })), "starting the worker");
    assert.equal(jobs.progressMessage(state({ stage: "capture", message: "tracing the target" })), "capture: tracing the target");
    assert.equal(jobs.progressMessage(state({ message: "worker started" })), "worker started");
  });
});

describe("JobTracker", () => {
  test("keeps the latest state per job; running and latest", () => {
    const t = new jobs.JobTracker();
    t.update(state({ jobId: "a", state: "done" }));
    t.update(state({ jobId: "b", state: "running" }));
    assert.equal(t.latest?.jobId, "b");
    assert.equal(t.running?.jobId, "b");
    t.update(state({ jobId: "b", state: "cancelled" }));
    assert.equal(t.running, undefined);
    assert.equal(t.get("a")?.state, "done");
  });

  test("whenFinal resolves at once for a finished job, later for a running one", async () => {
    const t = new jobs.JobTracker();
    t.update(state({ jobId: "a", state: "failed" }));
    assert.equal((await t.whenFinal("a")).state, "failed");
    const p = t.whenFinal("b");
    t.update(state({ jobId: "b", state: "running" }));
    t.update(state({ jobId: "other", state: "done" }));
    t.update(state({ jobId: "b", state: "done" }));
    assert.equal((await p).state, "done");
  });

  test("failRunning ends every unfinished job (the server went away)", async () => {
    const t = new jobs.JobTracker();
    t.update(state({ jobId: "a", state: "running" }));
    const p = t.whenFinal("a");
    t.failRunning("the Ekka language server stopped");
    const final = await p;
    assert.equal(final.state, "failed");
    assert.equal(final.error?.message, "the Ekka language server stopped");
  });
});

describe("followJob (notification with Cancel)", () => {
  test("a cancellable notification whose message and percentage follow ekka/jobState, closed at the end", async () => {
    const t = new jobs.JobTracker();
    t.update(state({ state: "queued" }));
    const done = jobs.followJob(t, "j1", "Ekka: diagnosing demo.ekka.toml", async () => undefined);
    await tick();
    assert.equal(mock.progress.length, 1);
    const p = mock.progress[0];
    assert.deepEqual(p.options, { location: ProgressLocation.Notification, title: "Ekka: diagnosing demo.ekka.toml", cancellable: true });
    t.update(state({ stage: "capture", message: "tracing the target", percent: 0 }));
    t.update(state({ stage: "capture", message: "tracing the reference", percent: 35 }));
    t.update(state({ jobId: "someone-else", stage: "tree", percent: 90 }));
    t.update(state({ stage: "analysis", message: "computing error ratios", percent: 85 }));
    t.update(state({ state: "done", stage: null, percent: 100, message: "divergent" }));
    const final = await done;
    assert.equal(final.state, "done");
    assert.equal(p.done, true, "the notification closed");
    assert.deepEqual(
      p.reports.map((r) => r.message),
      ["starting the worker", "capture: tracing the target", "capture: tracing the reference", "analysis: computing error ratios", "divergent"],
    );
    assert.deepEqual(
      p.reports.map((r) => r.increment),
      [undefined, undefined, 35, 50, 15],
    );
  });

  test("Cancel calls back with the job id; the notification stays until the job is cancelled", async () => {
    const t = new jobs.JobTracker();
    t.update(state({ state: "running", stage: "capture" }));
    const cancelled: string[] = [];
    const done = jobs.followJob(t, "j1", "Ekka", async (id) => void cancelled.push(id));
    await tick();
    mock.progress[0].token.cancel();
    assert.deepEqual(cancelled, ["j1"]);
    assert.equal(mock.progress[0].reports.at(-1)?.message, "cancelling…");
    await tick();
    assert.equal(mock.progress[0].done, false);
    t.update(state({ state: "cancelled", message: "cancelled" }));
    assert.equal((await done).state, "cancelled");
    assert.equal(mock.progress[0].done, true);
  });

  test("a cancel that fails does not break the notification", async () => {
    const t = new jobs.JobTracker();
    t.update(state({}));
    const done = jobs.followJob(t, "j1", "Ekka", () => Promise.reject(new Error("server gone")));
    await tick();
    mock.progress[0].token.cancel();
    t.failRunning("server gone");
    assert.equal((await done).state, "failed");
  });
});
