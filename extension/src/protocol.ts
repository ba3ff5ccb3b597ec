// TypeScript side of the contracts in DESIGN.md ("Contracts other tools rely on"). Types only: no 'vscode' import.

/** Server command (LSP workspace/executeCommand) that starts a diagnosis; argument: spec-file or repro-script URI. */
export const SERVER_DIAGNOSE_COMMAND = "ekka.server.diagnose";

/** Custom notification carrying the report for the tree view, plots and status bar. */
export const REPORT_UPDATED_NOTIFICATION = "ekka/reportUpdated";

export type Verdict = "divergent" | "consistent" | "inputs-differ";

export interface SuspectTarget {
  module: string;
  class: string;
  file?: string;
  line?: number;
}

export interface Suspect {
  rank: number;
  target: SuspectTarget;
  reference?: { modules: string[] };
  error_ratio: number;
  onset_token: number | null;
  evidence?: string;
}

/** `OUTDIR/report.json`, schema "ekka.report/1". */
export interface Report {
  schema: string;
  verdict: Verdict;
  suspects: Suspect[];
}
