// The "Silent errors" view: the verdict, the served configuration, the ranked suspects and what was and was not
// observed (checks, not checked, notes) of the latest report (nodes built by suspects.ts).
import * as vscode from "vscode";
import type { ReportUpdated } from "./protocol";
import { type SourceLocation, type SuspectNode, treeMessage, treeNodes } from "./suspects";

/** The "Silent errors" view's id (package.json contributes.views). */
export const SUSPECTS_VIEW = "ekka.suspects";

/** Command (registered by the extension, hidden from the palette) that opens a source location. */
export const OPEN_LOCATION_COMMAND = "ekka.openLocation";

/** TreeItem for one node: nodes with children are collapsible (the first suspect expanded, and any node that asks
 * to be), clicking opens `node.location`. */
export function toTreeItem(node: SuspectNode): vscode.TreeItem {
  const collapsible =
    node.children.length === 0
      ? vscode.TreeItemCollapsibleState.None
      : (node.expanded ?? node.suspect?.rank === 1)
        ? vscode.TreeItemCollapsibleState.Expanded
        : vscode.TreeItemCollapsibleState.Collapsed;
  const item = new vscode.TreeItem(node.label, collapsible);
  item.id = node.id;
  item.description = node.description;
  item.tooltip = node.tooltip;
  item.contextValue = node.kind === "suspect" ? (node.suspect?.target.call_file ? "suspect.withCallSite" : "suspect") : node.kind;
  item.accessibilityInformation = { label: node.ariaLabel };
  const color =
    node.iconColor ??
    (node.icon === "error" ? "list.errorForeground" : node.icon === "warning" ? "list.warningForeground" : undefined);
  item.iconPath = color ? new vscode.ThemeIcon(node.icon, new vscode.ThemeColor(color)) : new vscode.ThemeIcon(node.icon);
  if (node.location !== undefined) {
    item.resourceUri = vscode.Uri.file(node.location.file);
    item.command = { command: OPEN_LOCATION_COMMAND, title: "Open source", arguments: [node.location] };
  }
  return item;
}

export class SuspectTreeProvider implements vscode.TreeDataProvider<SuspectNode>, vscode.Disposable {
  private readonly emitter = new vscode.EventEmitter<SuspectNode | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;
  private nodes: SuspectNode[] = [];
  private current: ReportUpdated | undefined;

  setReport(update: ReportUpdated | undefined): void {
    this.current = update;
    this.nodes = update === undefined ? [] : treeNodes(update);
    this.emitter.fire(undefined);
  }

  get report(): ReportUpdated | undefined {
    return this.current;
  }

  get message(): string | undefined {
    return treeMessage(this.current);
  }

  getTreeItem(node: SuspectNode): vscode.TreeItem {
    return toTreeItem(node);
  }

  getChildren(node?: SuspectNode): SuspectNode[] {
    return node === undefined ? this.nodes : node.children;
  }

  getParent(node: SuspectNode): SuspectNode | undefined {
    const find = (nodes: SuspectNode[]): SuspectNode | undefined => {
      for (const n of nodes) {
        if (n.children.includes(node)) return n;
        const deeper = find(n.children);
        if (deeper !== undefined) return deeper;
      }
      return undefined;
    };
    return find(this.nodes);
  }

  dispose(): void {
    this.emitter.dispose();
  }
}

/** Opens `location` (1-based line) in an editor with the cursor on that line; a missing file is reported. */
export async function openLocation(location: SourceLocation | undefined): Promise<boolean> {
  if (location === undefined || typeof location.file !== "string") {
    void vscode.window.showWarningMessage("Ekka: this suspect has no source location.");
    return false;
  }
  const line = Math.max(0, location.line - 1);
  const uri = vscode.Uri.file(location.file);
  try {
    const doc = await vscode.workspace.openTextDocument(uri);
    const pos = new vscode.Position(line, 0);
    const editor = await vscode.window.showTextDocument(doc, {
      selection: new vscode.Range(pos, pos),
      preview: false,
    });
    editor.revealRange(new vscode.Range(pos, pos), vscode.TextEditorRevealType.InCenterIfOutsideViewport);
    return true;
  } catch (err) {
    void vscode.window.showWarningMessage(
      `Ekka: cannot open ${location.file}:${location.line} (${err instanceof Error ? err.message : String(err)}). ` +
        "Was the diagnosis run on another machine (ekka.executor)?",
    );
    return false;
  }
}
