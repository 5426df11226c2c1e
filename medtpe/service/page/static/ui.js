// The compression page. It calls the public API only (GET /readyz, POST /tokenize and
// /predict), so what it shows is what any client gets. The API key and the record
// live in this page's memory: never in the URL, localStorage, sessionStorage, IndexedDB or cookies.
"use strict";

const PALETTE = 6; // token colours, taken in turn (ui.css: .c0 ... .c5)
const NEWLINE_MARK = "\u21b5"; // shown before each newline inside a token

// `views`: each token view shown, with the token list it shows (for the hover box)
const state = { apiKey: "", examples: [], served: null, views: new WeakMap() };
const $ = (id) => document.getElementById(id);

/** A problem found by the page itself, before any request. */
class PageError extends Error {}

/** An error answer of the API: its status and JSON body (`{error, detail}`). */
class ApiError extends Error {
  constructor(status, body, text) {
    super(`HTTP ${status}`);
    this.status = status;
    this.body = body;
    this.text = text;
  }
}

/** The API's URL for `path`, relative to the page (served at <service>/ui/). */
function apiUrl(path) {
  return new URL(`../${path}`, document.baseURI).href;
}

/** GET or POST JSON; the key goes in the Authorization header, nothing else is kept. */
async function callApi(path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (state.apiKey) headers.Authorization = `Bearer ${state.apiKey}`;
  let response;
  try {
    response = await fetch(apiUrl(path), {
      method: body === undefined ? "GET" : "POST",
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
  } catch (error) {
    throw new PageError(`No answer from the service (${error.message}).`);
  }
  const text = await response.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  if (!response.ok) throw new ApiError(response.status, json, text);
  return json;
}

// ---- start-up: what the service offers -------------------------------------------------------

async function loadServiceInfo() {
  let ready;
  try {
    ready = await callApi("readyz");
  } catch (error) {
    ready = error instanceof ApiError ? error.body : null;
  }
  const status = $("service-status");
  if (!ready || ready.max_input_tokens === undefined) {
    status.textContent = `service ${ready ? ready.status : "unreachable"}; retrying…`;
    status.classList.add("bad");
    setTimeout(loadServiceInfo, 3000);
    return;
  }
  state.served = ready;
  const model = ready.model;
  status.classList.toggle("bad", ready.status !== "ready");
  status.textContent =
    `${model.name} · ${model.mode} mode · artefact ${model.artefact_id} · ` +
    `input budget ${ready.max_input_tokens} tokens · ${ready.status}`;
  fillBudgets(ready);
  $("both-modes-choice").hidden = !(ready.modes && ready.modes.length > 1);
}

/** The budgets this instance offers: its own, and the validated ones below it. */
function fillBudgets(ready) {
  const select = $("budget");
  const budgets = ready.validated_budgets.filter((b) => b < ready.max_input_tokens);
  const options = [[String(""), `${ready.max_input_tokens} (served)`]];
  for (const b of budgets.reverse()) options.push([String(b), `${b} (validated)`]);
  select.replaceChildren(...options.map(([value, label]) => new Option(label, value)));
}

async function loadTasks() {
  let ready;
  try {
    ready = await callApi("readyz");
  } catch (error) {
    if (!(error instanceof ApiError) || !error.body) throw error;
    ready = error.body; // not ready yet: its answer names the tasks all the same
  }
  $("task-choices").replaceChildren(
    ...ready.tasks.map((task, i) => {
      const label = document.createElement("label");
      label.className = "inline";
      const box = document.createElement("input");
      box.type = "checkbox";
      box.name = "task";
      box.value = task;
      box.checked = i === 0; // one task by default
      label.append(box, task);
      return label;
    }),
  );
}

function taskBoxes() {
  return [...document.querySelectorAll('#task-choices input[name="task"]')];
}

/** The tasks ticked, in the service's order. */
function chosenTasks() {
  return taskBoxes()
    .filter((box) => box.checked)
    .map((box) => box.value);
}

async function loadExamples() {
  const response = await fetch("examples/examples.json", { cache: "no-store" });
  const bundled = await response.json();
  state.examples = bundled.examples;
  $("attribution").textContent = `Examples: ${bundled.attribution}`;
  const select = $("example");
  for (const example of state.examples) select.append(new Option(example.title, example.id));
}

function useExample() {
  const example = state.examples.find((e) => e.id === $("example").value);
  if (!example) return;
  for (const box of taskBoxes()) box.checked = box.value === example.task;
  const record = { events: example.events };
  if (example.prediction_time) record.prediction_time = example.prediction_time;
  $("record").value = formatRecord(record);
}

/** JSON with one event per line. */
function formatRecord(record) {
  const lines = record.events.map((event) => `    ${JSON.stringify(event)}`);
  const head = record.prediction_time
    ? `{\n  "prediction_time": ${JSON.stringify(record.prediction_time)},\n  "events": [\n`
    : `{\n  "events": [\n`;
  return `${head}${lines.join(",\n")}\n  ]\n}`;
}

// ---- requests ---------------------------------------------------------------------------------

/** The record in the text box: an array of events, or an object sent as it is. */
function readRecord() {
  const text = $("record").value.trim();
  if (!text) throw new PageError("Paste a record or pick an example first.");
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new PageError(`The record is not JSON: ${error.message}`);
  }
  if (Array.isArray(value)) return { events: value };
  if (value !== null && typeof value === "object") return value;
  throw new PageError("The record must be a JSON array of events or an object with `events`.");
}

function budget() {
  const value = $("budget").value;
  return value ? Number(value) : undefined;
}

/** The record with the tasks ticked: `task` for one, `tasks` for several (the page's choice
 * replaces any `task` or `tasks` of a pasted object). */
function withTasks(record) {
  const { task, tasks, ...rest } = record;
  const chosen = chosenTasks();
  if (chosen.length === 0) throw new PageError("Tick at least one task.");
  return chosen.length === 1 ? { ...rest, task: chosen[0] } : { ...rest, tasks: chosen };
}

async function tokenize() {
  const body = withTasks(readRecord());
  if (budget() !== undefined) body.max_input_tokens = budget();
  const out = await callApi("tokenize", body);
  if (out.results) renderTaskTokens(out);
  else renderTokens(out);
}

async function predict() {
  const record = withTasks(readRecord());
  const options = { ...(record.options || {}), return_probabilities: true };
  if (budget() !== undefined) options.max_input_tokens = budget();
  if ($("both-modes").checked && !$("both-modes-choice").hidden) options.both_modes = true;
  const out = await callApi("predict", { ...record, options });
  const byMode = (a, b) => (a.model.mode === "original" ? -1 : 1);
  // one column per answer: each task's, its modes side by side
  const answers = (out.results || [out]).flatMap((answer) =>
    (answer.other_mode ? [answer, answer.other_mode] : [answer]).sort(byMode),
  );
  renderPrediction(answers, out.results ? out.results.length : 1);
}

/** Run one action with the buttons disabled; any error is shown, never a blank page. */
async function run(action) {
  const buttons = [$("tokenize"), $("predict")];
  buttons.forEach((b) => (b.disabled = true));
  $("busy").hidden = false;
  hideError();
  try {
    await action();
  } catch (error) {
    showError(error);
  } finally {
    buttons.forEach((b) => (b.disabled = false));
    $("busy").hidden = true;
  }
}

// ---- errors -----------------------------------------------------------------------------------

function hideError() {
  $("error").hidden = true;
}

/** The API's error as it states it: status, code, and each offending field with its message. */
function showError(error) {
  const items = [];
  let title;
  if (error instanceof ApiError) {
    const body = error.body;
    title = `The API answered ${error.status}` + (body && body.error ? `: ${body.error}` : "");
    const detail = body ? body.detail : error.text;
    if (Array.isArray(detail)) {
      for (const item of detail) {
        const li = document.createElement("li");
        li.className = "api-error";
        const where = document.createElement("code");
        where.className = "loc";
        where.textContent = (item.loc || []).join(" › ");
        const msg = document.createElement("span");
        msg.className = "msg";
        msg.textContent = ` ${item.msg}`;
        li.append(where, msg, ` (${item.type})`);
        items.push(li);
      }
    } else {
      const li = document.createElement("li");
      li.className = "api-error";
      li.textContent = String(detail || "no detail");
      items.push(li);
    }
  } else {
    title = error instanceof PageError ? "Check the request" : "Unexpected page error";
    const li = document.createElement("li");
    li.textContent = error.message;
    items.push(li);
  }
  $("error-title").textContent = title;
  $("error-detail").replaceChildren(...items);
  $("error").hidden = false;
}

// ---- tokens -----------------------------------------------------------------------------------

function percent(x, digits = 1) {
  return `${(100 * x).toFixed(digits)} %`;
}

function count(n) {
  return n.toLocaleString("en-US");
}

/** A text, or one task's prompt: both segmentations. */
function renderTokens(out) {
  const merged = new Map(out.merged.map((m) => [m.id, m]));
  showPanes(out, merged, "");
  const facts = [
    ["original tokens", out.original.count, "original-total"],
    ["MedTPE tokens", out.medtpe.count, "medtpe-total"],
    ["compression", percent(out.compression_rate), "compression"],
    ["merged tokens used", merged.size, "merged-kinds"],
  ];
  renderSummary(facts, out.original.count, out.medtpe.count, out.max_input_tokens);
  renderEventsNote([out.events], out.max_input_tokens);
  $("tasks-note").hidden = true;
  $("task-tails").hidden = true;
  $("task-tails").replaceChildren();
  $("tokens").hidden = false;
}

/** Several tasks' prompts about one record: the part they share once (head and record), then
 * each task's tail under its name. */
function renderTaskTokens(out) {
  const shared = out.shared;
  const results = out.results;
  const merged = new Map(shared.merged.map((m) => [m.id, m]));
  for (const r of results) for (const m of r.tail.merged) merged.set(m.id, m);
  showPanes(shared, merged, "Read once, head and record: ");
  const longest = (side) => Math.max(...results.map((r) => r.total[side]));
  const facts = [
    ["tasks", results.length, "task-total"],
    ["original tokens read once", count(shared.original.count), "original-total"],
    ["MedTPE tokens read once", count(shared.medtpe.count), "medtpe-total"],
    ["compression", percent(shared.compression_rate), "compression"],
    ["merged tokens used", merged.size, "merged-kinds"],
  ];
  renderSummary(facts, longest("original"), longest("medtpe"), out.max_input_tokens);
  renderEventsNote(
    results.map((r) => r.events),
    out.max_input_tokens,
  );
  const tails = results.map((r) => r.tail.medtpe.count);
  const low = Math.min(...tails);
  const high = Math.max(...tails);
  const each = low === high ? count(low) : `${count(low)}–${count(high)}`;
  const whole = results.reduce((sum, r) => sum + r.total.medtpe, 0);
  const note = $("tasks-note");
  note.textContent =
    `${results.length} tasks: the record's ${count(shared.medtpe.count)} MedTPE tokens read ` +
    `once, then ${each} tokens per task (${count(whole)} if each prompt were read whole).`;
  note.hidden = false;
  const holder = $("task-tails");
  holder.replaceChildren(...results.map((r) => taskTail(r, shared, merged)));
  holder.hidden = false;
  $("tokens").hidden = false;
}

/** The shared panes (`original-tokens`, `medtpe-tokens`) with `part`'s tokens; `title` before
 * their headings. */
function showPanes(part, merged, title) {
  fillTokenView($("original-tokens"), "original", part.original, null, 0);
  fillTokenView($("medtpe-tokens"), "medtpe", part.medtpe, merged, 0);
  $("original-count").textContent = `(${part.original.count})`;
  $("medtpe-count").textContent = `(${part.medtpe.count})`;
  for (const heading of document.querySelectorAll("#tokens .panes .part-title")) {
    heading.textContent = title;
  }
}

/** One task's tail: its name, what it adds and its whole prompt, both segmentations. */
function taskTail(result, shared, merged) {
  const block = document.createElement("section");
  block.className = "task-tail";
  block.dataset.task = result.task;
  const heading = document.createElement("h3");
  const tail = result.tail;
  heading.append(
    result.task,
    Object.assign(document.createElement("span"), {
      className: "count",
      textContent:
        ` +${count(tail.original.count)} original → +${count(tail.medtpe.count)} MedTPE tokens` +
        ` · whole prompt ${count(result.total.original)} → ${count(result.total.medtpe)}`,
    }),
  );
  const panes = document.createElement("div");
  panes.className = "panes";
  for (const [side, label, tokenMerges] of [
    ["original", "Original tokens", null],
    ["medtpe", "MedTPE tokens", merged],
  ]) {
    const pane = document.createElement("div");
    pane.className = "pane";
    const title = document.createElement("h4");
    title.textContent = label;
    const view = document.createElement("pre");
    view.className = `token-view ${side}-tail`;
    fillTokenView(view, side, tail[side], tokenMerges, shared[side].count);
    pane.append(title, view);
    panes.append(pane);
  }
  block.append(heading, panes);
  return block;
}

/** The figures above the tokens; the budget's share is the longest prompt's. */
function renderSummary(facts, originalTokens, medtpeTokens, budgetTokens) {
  if (budgetTokens) {
    facts.push([
      `budget used (of ${budgetTokens})`,
      percent(originalTokens / budgetTokens),
      "budget-used",
    ]);
    facts.push(["MedTPE share of budget", percent(medtpeTokens / budgetTokens), "medtpe-share"]);
  }
  $("summary").replaceChildren(
    ...facts.map(([label, value, id]) => {
      const div = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = label;
      dd.textContent = String(value);
      dd.id = id;
      div.append(dt, dd);
      return div;
    }),
  );
}

/** What the window kept of the record: one line when every prompt kept the same events (one
 * task, or a record rendered once), else each task's. */
function renderEventsNote(counts, budgetTokens) {
  const note = $("events-note");
  const first = counts[0];
  const cut = counts.some((events) => events && events.kept < events.total);
  note.classList.toggle("cut", cut);
  const same = counts.every((e) => e && e.kept === first.kept && e.total === first.total);
  if (!first) {
    note.textContent = "";
  } else if (!same) {
    note.textContent = `Events kept within the ${budgetTokens}-token budget: ` +
      counts.map((e) => `${e.kept} of ${e.total}`).join(", ") + " (in the order of the tasks).";
  } else if (first.kept < first.total) {
    const left = first.total - first.kept;
    note.textContent =
      `The window left out ${left} older event${left === 1 ? "" : "s"}: ${first.kept} of ` +
      `${first.total} events fit the ${budgetTokens}-token budget (the prompt says so).`;
  } else {
    note.textContent = `All ${first.total} events fit the ${budgetTokens}-token budget.`;
  }
}

/** One coloured span per token (newlines marked), in a fragment, then swapped in at once; the
 * view keeps its list, merged tokens and the prompt position of its first token (`offset`) for
 * the hover box. */
function fillTokenView(view, side, list, merged, offset) {
  state.views.set(view, { side, list, merged, offset });
  const fragment = document.createDocumentFragment();
  list.tokens.forEach((text, i) => {
    const span = document.createElement("span");
    const isMerged = merged !== null && merged.has(list.ids[i]);
    span.className = `tok c${i % PALETTE}${isMerged ? " merged" : ""}`;
    span.dataset.index = String(i);
    span.textContent = text.includes("\n") ? text.replaceAll("\n", `${NEWLINE_MARK}\n`) : text;
    fragment.append(span);
  });
  view.replaceChildren(fragment);
}

/** The hover box: id and text of a token; for a MedTPE token, the pair it replaces. */
function showHover(event) {
  const span = event.target.closest(".tok");
  const box = $("hover");
  const view = span ? state.views.get(span.parentElement) : undefined;
  if (!view || !span.dataset.index) {
    box.hidden = true;
    return;
  }
  const { side, list } = view;
  const i = Number(span.dataset.index);
  const id = list.ids[i];
  const where = view.offset + i + 1;
  const lines = [[`${side === "medtpe" ? "MedTPE" : "original"} token ${where} · id ${id}`]];
  lines.push(["text ", code(list.tokens[i])]);
  const merged = view.merged ? view.merged.get(id) : undefined;
  if (merged) {
    lines.push([
      "replaces the pair ",
      code(merged.pair_tokens[0]),
      ` (${merged.pair[0]}) + `,
      code(merged.pair_tokens[1]),
      ` (${merged.pair[1]})`,
    ]);
    lines.push([`${merged.base_ids.length} original tokens: ${merged.base_ids.join(" ")}`]);
    if (merged.reuses !== null) lines.push(["reuses the id of the rare token ", code(merged.reuses)]);
  }
  box.replaceChildren(
    ...lines.map((parts) => {
      const div = document.createElement("div");
      div.append(...parts);
      return div;
    }),
  );
  box.hidden = false;
  const x = Math.min(event.clientX + 14, window.innerWidth - box.offsetWidth - 8);
  const y = Math.min(event.clientY + 16, window.innerHeight - box.offsetHeight - 8);
  box.style.left = `${Math.max(x, 8)}px`;
  box.style.top = `${Math.max(y, 8)}px`;
}

function code(text) {
  const element = document.createElement("code");
  element.textContent = JSON.stringify(text).slice(1, -1);
  return element;
}

// ---- prediction -------------------------------------------------------------------------------

function answerText(prediction) {
  if (prediction === null || prediction === undefined) return "no answer";
  if (prediction === true) return "yes";
  if (prediction === false) return "no";
  return Array.isArray(prediction) ? prediction.join(", ") || "none" : String(prediction);
}

function ms(x) {
  return `${x.toFixed(1)} ms`;
}

/** One column per answer (one per mode; with several tasks, per task and mode). */
function renderPrediction(answers, nTasks) {
  const rows = [
    ["mode", (a) => a.model.mode],
    ["answer", (a) => answerText(a.prediction), "answer"],
    ['p("yes")', (a) => (a.probabilities && "yes" in a.probabilities ? a.probabilities.yes.toFixed(3) : "—"), "p-yes"],
    ["format compliant", (a) => (a.format_ok ? "yes" : "no")],
    ["prompt tokens", (a) => `${a.tokens.original} original → ${a.tokens.medtpe} MedTPE (${percent(a.tokens.compression_rate)} shorter)`],
    ["events kept", (a) => `${a.events.kept} of ${a.events.total}`],
    ["generated tokens", (a) => String(a.tokens.generated)],
    ["render", (a) => ms(a.latency_ms.render)],
    ["tokenize", (a) => ms(a.latency_ms.tokenize)],
    ["generate", (a) => ms(a.latency_ms.generate)],
    ["total", (a) => ms(a.latency_ms.total), "latency-total"],
    ["model", (a) => `${a.model.name} · artefact ${a.model.artefact_id}`],
  ];
  if (nTasks > 1) {
    rows.unshift(["task", (a) => a.task, "task"]);
    const cached = (a) => (a.cached_tokens === undefined ? "—" : String(a.cached_tokens));
    rows.splice(rows.length - 1, 0, ["read from the prefix cache", cached, "cached"]);
  }
  const table = $("prediction-table");
  table.replaceChildren(
    ...rows.map(([label, cell, cls]) => {
      const tr = document.createElement("tr");
      const th = document.createElement("th");
      th.textContent = label;
      tr.append(th);
      for (const answer of answers) {
        const td = document.createElement("td");
        td.textContent = cell(answer);
        if (cls) td.classList.add(cls);
        td.dataset.mode = answer.model.mode;
        tr.append(td);
      }
      return tr;
    }),
  );
  $("prediction").hidden = false;
}

// ---- wiring -----------------------------------------------------------------------------------

function start() {
  $("api-key").addEventListener("input", (event) => {
    state.apiKey = event.target.value.trim();
  });
  $("example").addEventListener("change", useExample);
  $("tokenize").addEventListener("click", () => run(tokenize));
  $("predict").addEventListener("click", () => run(predict));
  // the tokens section holds every token view (the shared panes and each task's tail)
  $("tokens").addEventListener("mousemove", showHover);
  $("tokens").addEventListener("mouseleave", () => ($("hover").hidden = true));
  loadServiceInfo();
  Promise.all([loadTasks(), loadExamples()]).catch(showError);
}

start();
