// The compression page. It calls the public API only (GET /readyz, POST /tokenize and
// /predict), so what it shows is what any client gets. The API key and the record
// live in this page's memory: never in the URL, localStorage, sessionStorage, IndexedDB or cookies.
"use strict";

const PALETTE = 6; // token colours, taken in turn (ui.css: .c0 ... .c5)
const NEWLINE_MARK = "\u21b5"; // shown before each newline inside a token

const state = { apiKey: "", examples: [], served: null, tokenized: null };
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
  const tasks = ready.tasks;
  $("task").replaceChildren(...tasks.map((task) => new Option(task, task)));
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
  $("task").value = example.task;
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

async function tokenize() {
  const body = { ...readRecord(), task: $("task").value };
  if (budget() !== undefined) body.max_input_tokens = budget();
  const out = await callApi("tokenize", body);
  state.tokenized = out;
  renderTokens(out);
}

async function predict() {
  const record = readRecord();
  const options = { ...(record.options || {}), return_probabilities: true };
  if (budget() !== undefined) options.max_input_tokens = budget();
  if ($("both-modes").checked && !$("both-modes-choice").hidden) options.both_modes = true;
  const out = await callApi("predict", { ...record, task: $("task").value, options });
  const answers = out.other_mode ? [out, out.other_mode] : [out];
  renderPrediction(answers.sort((a, b) => (a.model.mode === "original" ? -1 : 1)));
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

function renderTokens(out) {
  const merged = new Map(out.merged.map((m) => [m.id, m]));
  fillTokenView($("original-tokens"), out.original, null);
  fillTokenView($("medtpe-tokens"), out.medtpe, merged);
  $("original-count").textContent = `(${out.original.count})`;
  $("medtpe-count").textContent = `(${out.medtpe.count})`;
  const budgetTokens = out.max_input_tokens;
  const facts = [
    ["original tokens", out.original.count, "original-total"],
    ["MedTPE tokens", out.medtpe.count, "medtpe-total"],
    ["compression", percent(out.compression_rate), "compression"],
    ["merged tokens used", merged.size, "merged-kinds"],
  ];
  if (budgetTokens) {
    facts.push([
      `budget used (of ${budgetTokens})`,
      percent(out.original.count / budgetTokens),
      "budget-used",
    ]);
    facts.push(["MedTPE share of budget", percent(out.medtpe.count / budgetTokens), "medtpe-share"]);
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
  const note = $("events-note");
  const events = out.events;
  note.classList.toggle("cut", Boolean(events && events.kept < events.total));
  if (!events) {
    note.textContent = "";
  } else if (events.kept < events.total) {
    const left = events.total - events.kept;
    note.textContent =
      `The window left out ${left} older event${left === 1 ? "" : "s"}: ${events.kept} of ` +
      `${events.total} events fit the ${budgetTokens}-token budget (the prompt says so).`;
  } else {
    note.textContent = `All ${events.total} events fit the ${budgetTokens}-token budget.`;
  }
  $("tokens").hidden = false;
}

/** One coloured span per token (newlines marked), in a fragment, then swapped in at once. */
function fillTokenView(view, list, merged) {
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
  if (!span || !state.tokenized || !span.dataset.index) {
    box.hidden = true;
    return;
  }
  const side = span.parentElement.id === "medtpe-tokens" ? "medtpe" : "original";
  const list = state.tokenized[side];
  const i = Number(span.dataset.index);
  const id = list.ids[i];
  const lines = [[`${side === "medtpe" ? "MedTPE" : "original"} token ${i + 1} · id ${id}`]];
  lines.push(["text ", code(list.tokens[i])]);
  const merged = side === "medtpe" ? state.tokenized.merged.find((m) => m.id === id) : null;
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

/** One column per answer (one per mode). */
function renderPrediction(answers) {
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
  for (const view of [$("original-tokens"), $("medtpe-tokens")]) {
    view.addEventListener("mousemove", showHover);
    view.addEventListener("mouseleave", () => ($("hover").hidden = true));
  }
  loadServiceInfo();
  Promise.all([loadTasks(), loadExamples()]).catch(showError);
}

start();
