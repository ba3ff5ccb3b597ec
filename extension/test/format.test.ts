import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { formatRatio, formatSuspectLabel, isDiagnosableFile, summarizeReport } from "../src/format";

const suspect = (over: Partial<{ rank: number; cls: string; module: string; ratio: number; onset: number | null }>) => ({
  rank: over.rank ?? 1,
  target: { module: over.module ?? "model.layers.0.self_attn", class: over.cls ?? "Attention" },
  reference: { modules: [] },
  evidence: "",
  error_ratio: over.ratio ?? 37.2,
  onset_token: over.onset === undefined ? 17 : over.onset,
});

describe("formatSuspectLabel", () => {
  test("the documented example", () => {
    assert.equal(formatSuspectLabel(suspect({})), "#1 Attention · 37.2× · from token 17");
  });

  test("no onset token: the onset part is left out", () => {
    assert.equal(formatSuspectLabel(suspect({ rank: 3, onset: null })), "#3 Attention · 37.2×");
  });

  test("onset token 0 is an onset, not a missing one", () => {
    assert.equal(formatSuspectLabel(suspect({ onset: 0 })), "#1 Attention · 37.2× · from token 0");
  });

  test("an onset_token field that is absent is treated like null", () => {
    const { onset_token: _omit, ...rest } = suspect({});
    assert.equal(formatSuspectLabel(rest), "#1 Attention · 37.2×");
  });

  test("ratios below 100 keep one decimal, even when it is zero", () => {
    assert.equal(formatSuspectLabel(suspect({ ratio: 2 })), "#1 Attention · 2.0× · from token 17");
    assert.equal(formatSuspectLabel(suspect({ ratio: 1.04 })), "#1 Attention · 1.0× · from token 17");
    assert.equal(formatSuspectLabel(suspect({ ratio: 1.05 })), "#1 Attention · 1.1× · from token 17");
    assert.equal(formatSuspectLabel(suspect({ ratio: 99.94 })), "#1 Attention · 99.9× · from token 17");
  });

  test("ratios of 100 and more are whole numbers", () => {
    assert.equal(formatSuspectLabel(suspect({ ratio: 100 })), "#1 Attention · 100× · from token 17");
    assert.equal(formatSuspectLabel(suspect({ ratio: 140.46 })), "#1 Attention · 140× · from token 17");
    assert.equal(formatSuspectLabel(suspect({ ratio: 12345.6 })), "#1 Attention · 12346× · from token 17");
  });

  test("a ratio that rounds up to 100 is shown as 100, not 100.0", () => {
    assert.equal(formatRatio(99.96), "100");
    assert.equal(formatRatio(99.95), "100");
  });

  test("non-finite ratios do not print NaN or Infinity", () => {
    assert.equal(formatRatio(Number.NaN), "?");
    assert.equal(formatRatio(Number.POSITIVE_INFINITY), "∞");
    assert.equal(formatRatio(Number.NEGATIVE_INFINITY), "-∞");
  });

  test("a suspect without a class is named by its module path", () => {
    assert.equal(
      formatSuspectLabel(suspect({ cls: "", module: "model.layers.3.mlp.act_fn", onset: null })),
      "#1 model.layers.3.mlp.act_fn · 37.2×",
    );
  });

  test("rank and class are shown as given", () => {
    assert.equal(formatSuspectLabel(suspect({ rank: 12, cls: "GeluAndMul", ratio: 5.55, onset: 4 })), "#12 GeluAndMul · 5.6× · from token 4");
  });
});

describe("summarizeReport", () => {
  test("divergent: the top-ranked suspect, whatever the array order", () => {
    const report = {
      verdict: "divergent" as const,
      suspects: [
        { ...suspect({ rank: 2, cls: "RMSNorm", ratio: 3 }) },
        { ...suspect({ rank: 1, cls: "GeluAndMul", ratio: 140.2, onset: 0 }) },
      ],
    };
    assert.equal(summarizeReport({ report }), "#1 GeluAndMul · 140× · from token 0");
  });

  test("otherwise the server's headline as it came; from an older server (no headline), the verdict", () => {
    const headline = "inconclusive: could not observe modules";
    assert.equal(summarizeReport({ report: { verdict: "inconclusive", suspects: [] }, headline }), headline);
    assert.equal(summarizeReport({ report: { verdict: "divergent", suspects: [] } }), "divergent");
    assert.equal(summarizeReport({ report: { verdict: "consistent", suspects: [] } }), "consistent");
    assert.equal(summarizeReport({ report: { verdict: "inputs-differ", suspects: [] } }), "inputs differ");
    assert.equal(summarizeReport({ report: { verdict: "inconclusive", suspects: [] } }), "inconclusive");
  });
});

describe("isDiagnosableFile", () => {
  const yes = [
    "/home/me/repro.py",
    "repro.py",
    "C:\\Users\\me\\repro.py",
    "/x/REPRO.PY",
    "/specs/gemma2.ekka.toml",
    "C:\\specs\\llama.EKKA.TOML",
    "/specs/.ekka.toml", // same as the menus' /\.ekka\.toml$/
    "/dir.with.dots/run.v2.py",
  ];
  const no = [
    "",
    "/home/me/notes.txt",
    "/home/me/pyproject.toml",
    "/home/me/ekka.toml", // a spec must be *.ekka.toml
    "/home/me/x.ekka.toml.bak",
    "/home/me/mod.pyc",
    "/home/me/stub.pyi",
    "/home/me/.py", // no stem
    "/home/me/pkg.py/", // a directory
    "/home/me/script.py.orig",
    "/home/me/repro_py",
    "/project.py/README", // the directory name does not count
  ];
  for (const p of yes) {
    test(`accepts ${JSON.stringify(p)}`, () => assert.equal(isDiagnosableFile(p), true));
  }
  for (const p of no) {
    test(`rejects ${JSON.stringify(p)}`, () => assert.equal(isDiagnosableFile(p), false));
  }
});
