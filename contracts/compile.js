#!/usr/bin/env node
// Compile Solidity with solcjs (WebAssembly; no native solc exists for this platform).
//   node compile.js            reads a solc standard-JSON input on stdin, prints solc's output JSON on stdout
//   node compile.js --version  prints the compiler's long version
// "@openzeppelin/..." and other package imports resolve from the node_modules folder given by
// ZOO_NODE_MODULES, else from the one Node finds solc in. Imports resolve only inside node_modules, never to
// arbitrary files, so the set of files a build reads is exactly what the Python side hashes for its cache.
'use strict';

const fs = require('fs');
const path = require('path');

function nodeModules() {
  if (process.env.ZOO_NODE_MODULES) {
    return path.resolve(process.env.ZOO_NODE_MODULES);
  }
  // .../node_modules/solc/index.js -> .../node_modules
  return path.dirname(path.dirname(require.resolve('solc')));
}

const MODULES = nodeModules();
const solc = require(path.join(MODULES, 'solc'));

function findImports(importPath) {
  const resolved = path.resolve(MODULES, importPath);
  if (!resolved.startsWith(MODULES + path.sep)) {
    return { error: `import ${importPath} leaves node_modules` };
  }
  try {
    return { contents: fs.readFileSync(resolved, 'utf8') };
  } catch (err) {
    return { error: `import ${importPath} not found in ${MODULES}: ${err.code || err.message}` };
  }
}

function main() {
  if (process.argv.includes('--version')) {
    process.stdout.write(solc.version() + '\n');
    return;
  }
  const input = fs.readFileSync(0, 'utf8');
  const output = solc.compile(input, { import: findImports });
  process.stdout.write(output);
}

main();
