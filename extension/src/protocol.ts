// TypeScript side of the contracts in DESIGN.md ("Contracts other tools rely on") and server/protocol.py.
// Types and names only: no 'vscode' import.
// The report (`OUTDIR/report.json`, schema "ekka.report/1") is typed by report.generated.ts, generated from
// ekka_core/contracts/report.py by scripts/gen_protocol_types.py; below are the names the extension uses for it.
import type { BisectSection, Report, ServingSection, TargetLocation } from "./report.generated";

export type * from "./report.generated";

/** Server commands (LSP workspace/executeCommand). */
export const SERVER_DIAGNOSE_COMMAND = "ekka.server.diagnose";
export const SERVER_CANCEL_COMMAND = "ekka.server.cancel";
export const SERVER_CLEAR_COMMAND = "ekka.server.clear";

/** Client command the server's code lenses invoke, with `{jobId, module}`. */
export const SHOW_DIVERGENCE_COMMAND = "ekka.showDivergence";
/** Client command of the release-bisection code lenses, with `{jobId, symbol?}`: the report's `bisect` diffs. */
export const SHOW_RELEASE_DIFF_COMMAND = "ekka.showReleaseDiff";

/** Custom notifications (server → client). */
export const REPORT_UPDATED_NOTIFICATION = "ekka/reportUpdated";
export const JOB_STATE_NOTIFICATION = "ekka/jobState";

/** LSP error code RequestFailed: `ekka.server.diagnose` answers it (with `data.jobId`) while a job runs. */
export const REQUEST_FAILED = -32803;

export type Verdict = NonNullable<Report["verdict"]>;
/** Where a suspect lives in the engine's source (`suspects[].target`). */
export type SuspectTarget = TargetLocation;
/** report.json `serving`: the served configuration, its symptom check, what tracing changed, triage. */
export type Serving = ServingSection;
/** report.json `bisect`, schema "ekka.bisect/1" (ekka_core/bisect). */
export type Bisect = BisectSection;

/** Which of what a diagnosis observed a coverage section is about (ekka_core/report/coverage.py `CoverageSection.key`). */
export type CoverageKey = "missing" | "checks" | "conventions" | "unchecked" | "notes";

/** One line of a coverage section: `label` (may be "") and `text`, as coverage.py words them. */
export interface CoverageItem {
  label: string;
  text: string;
}

/** A section of what a diagnosis looked at and what it did not (coverage.py `coverage()`, sent by the server). */
export interface CoverageSection {
  key: CoverageKey;
  title: string;
  items: CoverageItem[];
}

/** Payload of `ekka/reportUpdated`: the report, and the report in Python's words (server/present.py `rendered`),
 * which the extension shows as they are. A server from before those words leaves them out. */
export interface ReportUpdated {
  jobId: string;
  report: Report;
  paths?: { json?: string; md?: string; html?: string } | null;
  out_dir?: string | null;
  uri?: string | null;
  /** The verdict in a few words (`short_headline`, also the job's message): "inconclusive: could not observe modules". */
  headline?: string;
  /** The sections that have something to say, in the order a reader needs them (coverage.py `coverage`). */
  coverage?: CoverageSection[];
  /** How much was compared, in a few words (coverage.py `coverage_line`). */
  coverageLine?: string;
}

export type JobStateName = "queued" | "running" | "done" | "failed" | "cancelled";
export const FINAL_STATES: readonly JobStateName[] = ["done", "failed", "cancelled"];

/** Payload of `ekka/jobState` (the server's job record). */
export interface JobState {
  jobId: string;
  state: JobStateName;
  stage: string | null;
  percent?: number;
  message?: string;
  uri?: string | null;
  out_dir?: string | null;
  pid?: number | null;
  exit_code?: number | null;
  error?: { message: string; fix?: string | null; exit_code: number } | null;
  verdict?: Verdict | null;
}

export function isFinal(state: JobStateName): boolean {
  return FINAL_STATES.includes(state);
}

/** Argument of `ekka.server.diagnose` as the extension sends it. */
export interface DiagnoseArgs {
  uri: string;
  /** EKKA_* variables for the engine (tests and benchmarks only, e.g. EKKA_INJECT_BUG). */
  env?: Record<string, string>;
}
