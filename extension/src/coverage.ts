// What the diagnosis looked at and what it did not, as the "Silent errors" view shows it: the sections the server
// sent with the report (`coverage`, `coverageLine` of ekka/reportUpdated), rendered by ekka_core/report/coverage.py —
// the one rendering source of the CLI summary, report.md, report.html and the hover. Nothing is worded or filtered
// here: each section and item is shown as it came, linked to the report's record it is about (a check's status for
// its icon, a departure's class line for a click). Pure.
import type { CheckRecord, CoverageItem, CoverageSection, ReportUpdated, Suspect } from "./protocol";

export type { CoverageKey, CoverageSection } from "./protocol";

/** What the view says in place of the coverage when the server did not send it (a server from before it). */
export const COVERAGE_NOT_SENT = "Coverage not sent by this server";
export const COVERAGE_NOT_SENT_WHY =
  "This Ekka server sends the report without what the diagnosis observed and what it did not; update the Ekka " +
  "server, or read report.md.";

/** A section as the server sent it, with the records its items are about (by item, in the order of `items`). */
export interface ShownSection extends CoverageSection {
  /** "checks": the check each item reports (its status picks the icon). */
  checks?: (CheckRecord | undefined)[];
  /** "conventions": the departure each item names (its class line is where a click goes). */
  conventions?: (Suspect | undefined)[];
}

/** The check a "checks" item reports: coverage.py lists one item per entry of `report.checks`, in order. */
function checksOf(update: Pick<ReportUpdated, "report">, section: CoverageSection): (CheckRecord | undefined)[] {
  const checks = update.report.checks ?? [];
  return section.items.map((_, i) => (checks.length === section.items.length ? checks[i] : undefined));
}

/** The departure a "conventions" item names: its module (the label), the one with that summary (the text) first. */
function departureOf(update: Pick<ReportUpdated, "report">, item: CoverageItem): Suspect | undefined {
  const same = (update.report.conventions ?? []).filter((c) => c.target.module === item.label);
  return same.find((c) => c.summary === item.text) ?? same[0];
}

/** The server's sections, as sent, each with the records its items are about; undefined when the server sent none
 * (an older server: the view then says so rather than working the sections out itself). */
export function coverage(update: Pick<ReportUpdated, "report" | "coverage">): ShownSection[] | undefined {
  if (!Array.isArray(update.coverage)) return undefined;
  return update.coverage.map((section): ShownSection => {
    if (section.key === "checks") return { ...section, checks: checksOf(update, section) };
    if (section.key === "conventions") return { ...section, conventions: section.items.map((it) => departureOf(update, it)) };
    return section;
  });
}

/** How much was compared, as the server worded it (coverage.py `coverage_line`); undefined from an older server. */
export function coverageLine(update: Pick<ReportUpdated, "coverageLine">): string | undefined {
  return typeof update.coverageLine === "string" ? update.coverageLine : undefined;
}
