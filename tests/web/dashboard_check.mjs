// The swarm dashboard in a real browser (Debian's chromium, driven by
// playwright-core): the page must draw every server of the swarm with its
// span, and update when one is killed. Run by tests/api/mp_dashboard.cpp:
//
//   node dashboard_check.mjs URL '{"alpha":"0:3",...}' VICTIM_NODE VICTIM_PID [SCREENSHOT.png]
//
// Prints one JSON line per phase ({"phase": "rendered", ...}, {"phase":
// "after_kill", ...}) and exits 0, or prints {"error": ...} and exits 1.
import { chromium } from "playwright-core";

const [url, spansJson, victim, victimPid, screenshot] = process.argv.slice(2);
const want = JSON.parse(spansJson);
const executablePath = process.env.COROLLA_CHROMIUM || "/usr/bin/chromium";

function fail(message) {
  console.log(JSON.stringify({ error: message }));
  process.exit(1);
}

const browser = await chromium.launch({
  executablePath,
  headless: true,
  // The flags this machine needs: no sandbox as root, and no background
  // connections to hosts the closed network refuses.
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
}).catch((e) => fail("cannot start " + executablePath + ": " + e.message));

try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 640 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(url);

  // Every server drawn, online, with its span.
  const servers = async () =>
    page.$$eval("svg g.server", (gs) => gs.map((g) => ({ node: g.dataset.node, state: g.dataset.state, span: g.dataset.span })));
  const expected = Object.keys(want).length;
  await page.waitForFunction(
    (n) => document.querySelectorAll('svg g.server[data-state="online"]').length === n, expected, { timeout: 30000 });
  const drawn = await servers();
  for (const [node, span] of Object.entries(want)) {
    const s = drawn.find((d) => d.node === node);
    if (!s) fail(`server ${node} is not drawn; drawn: ${JSON.stringify(drawn)}`);
    if (s.span !== span) fail(`server ${node} is drawn over ${s.span}, expected ${span}`);
  }
  const rows = await page.$$eval("#servers tr", (trs) => trs.map((tr) => tr.dataset.node));
  // Each row's adapters cell, by server.
  const adapters = await page.$$eval("#servers tr", (trs) =>
    Object.fromEntries(trs.map((tr) => [tr.dataset.node, tr.querySelector("td.adapters")?.textContent ?? null])));
  const coverage = await page.$$eval("svg rect.block", (rs) => rs.map((r) => Number(r.dataset.online)));
  const status = await page.textContent("#status");
  console.log(JSON.stringify({ phase: "rendered", servers: drawn, rows, adapters, coverage, status }));
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });

  // Kill one; its record expires (the servers' short TTL) and the page
  // drops it and lists the change, without a reload.
  process.kill(Number(victimPid), "SIGKILL");
  await page.waitForFunction(
    (v) => !document.querySelector(`svg g.server[data-node="${v}"]`) &&
           !!document.querySelector('#events li[data-kind="vanished"]'),
    victim, { timeout: 40000 });
  const after = await servers();
  const events = await page.$$eval("#events li", (lis) => lis.map((li) => li.dataset.kind + " " + li.textContent));
  const coverageAfter = await page.$$eval("svg rect.block", (rs) => rs.map((r) => Number(r.dataset.online)));
  console.log(JSON.stringify({ phase: "after_kill", servers: after, coverage: coverageAfter, events,
                               status: await page.textContent("#status") }));
  if (errors.length) fail("script errors on the page: " + errors.join("; "));
} catch (e) {
  fail(e.message);
} finally {
  await browser.close();
}
