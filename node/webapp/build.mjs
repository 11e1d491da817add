// Builds the web app once at setup (./zoo): src/main.js and what it imports (viem from node_modules) bundled
// by esbuild into dist/assets/app.js, beside app.css and index.html. Nothing is fetched at run time.
// Usage: node node/webapp/build.mjs   (prints the bundle's size)

import { copyFileSync, mkdirSync, renameSync, rmSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const src = join(here, "src");
const dist = join(here, "dist");
const staging = join(here, "dist.tmp");

rmSync(staging, { recursive: true, force: true });
mkdirSync(join(staging, "assets"), { recursive: true });
await build({
  entryPoints: [join(src, "main.js")],
  bundle: true,
  format: "esm",
  minify: true,
  target: "es2022",
  legalComments: "none",
  outfile: join(staging, "assets", "app.js"),
  logLevel: "warning",
});
copyFileSync(join(src, "app.css"), join(staging, "assets", "app.css"));
copyFileSync(join(src, "index.html"), join(staging, "index.html"));
// The new build replaces the old at once: a node serving meanwhile never sees half of one.
rmSync(dist, { recursive: true, force: true });
renameSync(staging, dist);
console.log(`web app built: ${statSync(join(dist, "assets", "app.js")).size} bytes of JavaScript`);
