// generated from ekka_core/contracts/report.py by scripts/gen_protocol_types.py — do not edit
// (change the dataclasses, then run: .venv/bin/python scripts/gen_protocol_types.py)

/** `OUTDIR/report.json`, schema "ekka.report/1". */
export interface Report {
  schema: string;
  verdict: "divergent" | "consistent" | "inputs-differ" | "inconclusive";
  suspects: Suspect[];
  threshold?: number;
  dtype?: string;
  spec?: DiagnosisSpec | null;
  meta?: RunMeta;
  checked?: number;
  unchecked?: Unchecked[];
  notes?: string[];
  inputs_differ?: InputsDiffer[];
  plots?: Plots;
  serving?: ServingSection | null;
  conventions?: Suspect[];
  missing?: string[];
  checks?: CheckRecord[];
  agent?: AgentSection | null;
  bisect?: BisectSection | null;
  graph?: GraphLocalisation | null;
}

/** What the mapping agent did (``AgentOutcome.to_report``). */
export interface AgentSection {
  rounds?: number;
  tool_calls?: number;
  tool_errors?: number;
  malformed_tool_calls?: number;
  retries?: number;
  validator_problems?: string[];
  status?: string;
  ok?: boolean;
  message?: string;
  model?: string;
  components?: Record<string, number>;
  mapped?: string[];
  explained?: string[];
  from_knowledge_base?: string[];
  unchecked?: Record<string, string>[];
  usage?: AgentUsage;
  budget?: Record<string, unknown>;
  knowledge_base?: Record<string, unknown>;
  aligners?: Record<string, unknown>;
  transcript?: Record<string, string> | null;
  events?: string[];
  notes?: string[];
}

export interface AgentUsage {
  calls?: number;
  input_tokens?: number;
  output_tokens?: number;
  cache_creation_input_tokens?: number;
  cache_read_input_tokens?: number;
  dollars?: number;
}

/** One symbol whose source differs between the last good and the first bad release. */
export interface BisectChange {
  symbol: string;
  kind?: string;
  status?: string;
  file_good?: string | null;
  line_good?: number | null;
  file_bad?: string | null;
  line_bad?: number | null;
  calls?: string[];
  unified_diff?: string;
}

export interface BisectFix {
  last_bad?: string;
  first_good?: string;
  suspect?: BisectSuspect | null;
  changes?: BisectChange[];
  compared?: string[];
  custom_ops?: string[];
  note?: string;
}

/** ``report.bisect`` (schema ``ekka.bisect/1``): the releases tried, the outcome, what changed. */
export interface BisectSection {
  schema?: string;
  package?: string | null;
  candidates?: string[];
  bad_given?: string | null;
  outcome?: string;
  last_good?: string | null;
  first_bad?: string | null;
  suspect?: BisectSuspect | null;
  changes?: BisectChange[];
  compared?: string[];
  custom_ops?: string[];
  fix?: BisectFix | null;
  note?: string;
  tried?: BisectTried[];
  seconds?: number;
}

export interface BisectSuspect {
  module?: string | null;
  class?: string | null;
  file?: string | null;
  line?: number | null;
}

export interface BisectTried {
  label: string;
  verdict: string;
  seconds: number;
  env_seconds?: number;
  env_reused?: boolean;
  traces_reused?: boolean;
  python?: string;
  engine_version?: string;
  top_suspect?: string | null;
  report?: string;
  error?: string;
}

/** One check as the report lists it. */
export interface CheckRecord {
  check: string;
  status: "agrees" | "diverges" | "inconclusive" | "skipped";
  words?: string;
  compared?: number | null;
  missing?: string[];
  statistic?: number | null;
}

export interface ConfigChange {
  arg: string;
  served: unknown;
  traced: unknown;
  why: string;
}

export interface DiagnosisSpec {
  model: string;
  prompts?: string[];
  target?: string;
  reference?: string;
  dtype?: string;
  max_new_tokens?: number;
  engine_args?: Record<string, unknown>;
  messages?: Record<string, unknown>[];
  prompt_token_ids?: number[][];
  requests?: RequestSpec[];
  trace_modules?: string;
  trace_store_dtype?: string;
  trace_positions?: string;
  target_trace?: string;
  threshold?: number;
}

export interface EngineInfo {
  framework?: string;
  version?: string;
  dtype?: string;
  attn_implementation?: string | null;
  engine_args?: Record<string, unknown>;
  resolved_config?: Record<string, unknown>;
  config_changes?: unknown[];
}

/** One served feature's value in the served run and in the traced baseline, as each engine resolved it. */
export interface FactorDifference {
  served: unknown;
  baseline: unknown;
}

/** The outcome: ``departs`` is False with ``pieces`` all within noise (the compiled graph agrees with itself run */
export interface GraphLocalisation {
  replayable: boolean;
  threshold: number;
  row_threshold: number;
  dtype: string;
  pieces?: PieceResult[];
  inner_pieces?: PieceResult[];
  suspect?: PieceResult | null;
  suspect_nodes?: NodeSource[];
  node_words?: string;
  passes?: PassFinding[];
  tried_toggles?: string[];
  reason?: string;
  notes?: string[];
  root?: string;
}

export interface HeatMap {
  layers?: string[];
  positions?: number[];
  ratios?: (number | null)[][];
}

/** One request whose fed ids differ from the reference's own rendering of the same input. */
export interface InputsDiffer {
  prompt: number;
  request: string;
  input: string;
  position: number;
  fed_from: string;
  target?: number[];
  reference?: number[];
  target_len?: number;
  reference_len?: number;
  target_ids?: number[];
  reference_ids?: number[];
  target_tokens?: string[];
  reference_tokens?: string[];
  window_start?: number;
}

/** One FX node of the graph and the source line it was traced from (its ``stack_trace``'s innermost frame). */
export interface NodeSource {
  node: string;
  op: string;
  file: string | null;
  line: number | null;
  code: string | null;
  module?: string | null;
}

/** A compiler stage whose removal brings the suspect piece back within noise. */
export interface PassFinding {
  stage: string;
  name: string;
  ratio_without: number;
  words: string;
}

/** One piece of the graph: the nodes traced from one module call, compiled alone and run on the inputs the eager */
export interface PieceResult {
  index: number;
  module: string;
  module_class: string | null;
  nodes: number;
  error_ratio: number | null;
  worst_row?: number | null;
  worst_row_ratio?: number | null;
  departs?: boolean;
  not_compared?: string | null;
  covered_by_children?: boolean;
}

export interface Plots {
  series?: SeriesPoint[];
  change_point?: number | null;
  threshold?: number;
  heatmap?: HeatMap;
}

export interface PositionRatio {
  request: number;
  position: number;
  ratio: number;
  token_matches_reference: boolean;
  routing_tie?: boolean;
}

export interface ReferenceModules {
  modules?: string[];
}

/** One request as the user sends it: exactly one of ``prompt``, ``messages``, ``prompt_token_ids``. */
export interface RequestSpec {
  id?: string;
  prompt?: string | null;
  messages?: Record<string, unknown>[] | null;
  prompt_token_ids?: number[] | null;
  max_new_tokens?: number | null;
  after?: string | null;
  sampling?: Record<string, unknown>;
}

/** One row (request, token position) of a module's output far beyond the reference's own noise there. */
export interface RowFinding {
  request: number;
  position: number;
  ratio: number;
}

export interface RunMeta {
  ekka_version?: string;
  target?: EngineInfo | null;
  reference?: EngineInfo | null;
  traces?: string | null;
  reused_traces?: boolean;
  seconds?: number;
  culprit_traces?: string | null;
  culprit_target?: EngineInfo | null;
  injected_bug?: string | null;
  remote?: Record<string, unknown> | null;
}

export interface SeriesPoint {
  component: string;
  class?: string;
  error_ratio?: number | null;
  input_ratio?: number | null;
  same_dtype?: number | null;
  input_same_dtype?: number | null;
  order?: number;
  entered_after?: number | null;
}

/** The configurations the diagnosis ran: the served symptom check, the traced baseline, triage. */
export interface ServingSection {
  served_args?: Record<string, unknown>;
  served_resolved?: Record<string, unknown> | null;
  served?: SymptomCheck | null;
  traced?: SymptomCheck | null;
  traced_args?: Record<string, unknown> | null;
  changes?: ConfigChange[];
  triage?: Triage | null;
}

/** One ranked finding. */
export interface Suspect {
  rank: number;
  target: TargetLocation;
  kind?: "module" | "glue" | "convention" | "non-finite" | "rows" | "compiled";
  reference: ReferenceModules;
  error_ratio: number | null;
  input_ratio?: number | null;
  same_dtype?: number | null;
  onset_token: number | null;
  onset_phase?: string | null;
  evidence: string;
  summary?: string;
  rows?: RowFinding[];
  non_finite?: number;
  graph_nodes?: NodeSource[];
  compiler_stages?: PassFinding[];
}

export interface SymptomCheck {
  label: string;
  ratio: number;
  diverges: boolean;
  threshold: number;
  positions?: PositionRatio[];
  first?: PositionRatio | null;
  cached_tokens?: number;
  same_dtype?: number | null;
  note?: string;
  rerouted_tokens?: number;
  non_finite?: number;
}

/** Where the suspect lives in the engine's source. */
export interface TargetLocation {
  module: string;
  class: string;
  file?: string | null;
  line?: number | null;
  forward_file?: string | null;
  forward_line?: number | null;
  call_file?: string | null;
  call_line?: number | null;
  lines?: number[];
  between?: string[];
}

export interface Triage {
  served: SymptomCheck;
  baseline: SymptomCheck;
  differing?: Record<string, FactorDifference>;
  ruled_out?: Record<string, string>;
  kept_as_served?: string[];
  trials?: Trial[];
  culprit?: string[];
  direction?: string;
  words?: string;
  traced_under?: string[];
  untraceable?: string[];
  exhausted?: boolean;
}

export interface Trial {
  factors: string[];
  args: Record<string, unknown>;
  ratio: number | null;
  diverges: boolean | null;
  seconds?: number;
  error?: string | null;
  compiled_graph?: string;
}

export interface Unchecked {
  module: string;
  reason: string;
}
