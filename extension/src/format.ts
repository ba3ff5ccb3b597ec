// Labels and file checks shown in the UI. Pure: no 'vscode' import, so it is unit-tested in plain Node.
import type { Report, Suspect } from "./protocol";

/** Error ratio as shown to people: one decimal below 100, a whole number from 100 on ("37.2", "140"). */
export function formatRatio(ratio: number | null | undefined): string {
  if (ratio === null || ratio === undefined) {
    return "n/a";
  }
  if (Number.isNaN(ratio)) {
    return "?";
  }
  if (!Number.isFinite(ratio)) {
    return ratio > 0 ? "∞" : "-∞";
  }
  const oneDecimal = Math.round(ratio * 10) / 10;
  // Decide on the rounded value, so 99.96 reads "100", not "100.0".
  if (Math.abs(oneDecimal) >= 100) {
    return String(Math.round(ratio));
  }
  return oneDecimal.toFixed(1);
}

type SuspectLike = Pick<Suspect, "rank" | "error_ratio"> & {
  target: { module: string; class?: string };
  onset_token?: number | null;
};

/** A suspect's name: its class, or its module path when no class was recorded (e.g. a functional op). */
export function suspectName(s: { target: { module: string; class?: string } }): string {
  return s.target.class ? s.target.class : s.target.module;
}

/** "37.2× · from token 17": the ratio and, when there is one, the onset token. */
export function formatSuspectDetail(s: Pick<SuspectLike, "error_ratio" | "onset_token">): string {
  const parts = [`${formatRatio(s.error_ratio)}×`];
  if (s.onset_token !== null && s.onset_token !== undefined) {
    parts.push(`from token ${s.onset_token}`);
  }
  return parts.join(" · ");
}

/** "#1 Attention · 37.2× · from token 17"; the onset part is left out when there is no onset token. */
export function formatSuspectLabel(s: SuspectLike): string {
  return `#${s.rank} ${suspectName(s)} · ${formatSuspectDetail(s)}`;
}

/** The last path segment, for labels: "/a/b/attention.py" → "attention.py" (POSIX or Windows separators). */
export function baseName(filePath: string): string {
  return filePath.split(/[\\/]/).pop() ?? filePath;
}

/** "attention.py:229" (site-packages paths shortened to the part an engine developer recognises when `full`). */
export function formatLocation(file: string, line: number | null | undefined, full = false): string {
  let shown = baseName(file);
  if (full) {
    shown = file;
    for (const marker of ["site-packages/", "dist-packages/"]) {
      const i = file.indexOf(marker);
      if (i >= 0) {
        shown = file.slice(i + marker.length);
        break;
      }
    }
  }
  return line !== null && line !== undefined ? `${shown}:${line}` : shown;
}

/** The verdict's words when the server sent none (a server from before `headline`). */
const VERDICT_WORDS: Record<string, string> = { "inputs-differ": "inputs differ" };

/** One line for the status bar: for a divergent run its top-ranked suspect (class, ratio, onset), else the server's
 * headline as it came (ekka_core/contracts/report.py `short_headline`: "inconclusive: could not observe modules"),
 * or the bare verdict from an older server. */
export function summarizeReport(
  update: { report: Pick<Report, "verdict" | "suspects">; headline?: string },
): string {
  const { report, headline } = update;
  if (report.verdict === "divergent") {
    const top = [...(report.suspects ?? [])].sort((a, b) => a.rank - b.rank)[0];
    if (top !== undefined) return formatSuspectLabel(top);
  }
  return headline ?? VERDICT_WORDS[report.verdict] ?? String(report.verdict);
}

/**
 * Whether "Diagnose silent error" applies to a file: a Python repro script (`*.py`) or an Ekka spec
 * (`*.ekka.toml`, the same pattern as the menus' `resourceFilename =~ /\.ekka\.toml$/`).
 * Accepts POSIX or Windows paths; the extension is matched case-insensitively (Windows, macOS file systems).
 */
export function isDiagnosableFile(filePath: string): boolean {
  const base = filePath.split(/[\\/]/).pop() ?? "";
  const lower = base.toLowerCase();
  if (lower.endsWith(".ekka.toml")) {
    return true;
  }
  // ".py" alone has no stem; a trailing separator (a directory) leaves an empty base name.
  return lower.endsWith(".py") && lower.length > ".py".length;
}

/** The message of a thrown value, for the output channel and notifications. */
export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
