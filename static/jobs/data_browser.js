// The folder picker beside data_url and train_url, and in a parameter row named as a further input
// (data_url_1 ... data_url_9): the user's buckets in the stores the chosen pool's jobs may use (GET
// /api/v1/data), then one folder of one of them at a time, its sub-folders to go into and its objects for
// orientation. "Use this folder" writes the folder's URL into the field, which stays a free text field; for
// train_url a new sub-folder's name may be added to it. The strings are the template's (data- attributes of
// the dialog, translated there).
(function () {
  "use strict";

  const dialog = document.getElementById("data-browser");
  if (!dialog || typeof dialog.showModal !== "function") return;
  const words = dialog.dataset;
  const fieldLine = dialog.querySelector("[data-browse-field]");
  const goForm = dialog.querySelector("[data-browse-go]");
  const urlInput = goForm.querySelector("input");
  const crumbs = dialog.querySelector("[data-browse-crumbs]");
  const errorLine = dialog.querySelector("[data-browse-error]");
  const statusLine = dialog.querySelector("[data-browse-status]");
  const list = dialog.querySelector("[data-browse-list]");
  const newFolder = dialog.querySelector("[data-browse-new]");
  const newInput = newFolder.querySelector("input");
  const useButton = dialog.querySelector("[data-browse-use]");
  // scheme://bucket/ and the folders under it.
  const OBJECT_URL = /^(s3|obs):\/\/([^/]+)\/?(.*)$/i;
  // The parameters the platform fills as further inputs (jobs/launch/data_paths.py INPUT_NAME).
  const FURTHER_INPUT = /^data_url_[1-9]$/;
  const UNITS = ["B", "KB", "MB", "GB", "TB"];
  let number;
  try {
    number = new Intl.NumberFormat(document.documentElement.lang || undefined, { maximumFractionDigits: 1 });
  } catch (error) {
    number = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
  }

  let field = null;
  let opener = null;
  let shown = "";   // the folder listed now, as the API wrote it; "" while the buckets (or an error) show
  let ticket = 0;   // an answer to an older request is dropped

  function asFolder(text) {
    const found = OBJECT_URL.exec(text.trim());
    if (!found) return text.trim();
    const rest = found[3];
    return found[1].toLowerCase() + "://" + found[2] + "/" + (rest && !rest.endsWith("/") ? rest + "/" : rest);
  }

  // s3://bucket/a/b/ -> [["s3://bucket/", "s3://bucket/"], ["a", "s3://bucket/a/"], ["b", "s3://bucket/a/b/"]]
  function steps(url) {
    const found = OBJECT_URL.exec(url);
    if (!found) return [];
    let at = found[1] + "://" + found[2] + "/";
    const made = [[at, at]];
    found[3].split("/").filter(Boolean).forEach((part) => { at += part + "/"; made.push([part, at]); });
    return made;
  }

  function parentOf(url) {
    const made = steps(url);
    return made.length > 1 ? made[made.length - 2][1] : "";
  }

  function size(bytes) {
    let value = bytes;
    let unit = 0;
    while (value >= 1024 && unit < UNITS.length - 1) { value /= 1024; unit += 1; }
    return number.format(value) + " " + UNITS[unit];
  }

  function element(tag, className, text) {
    const made = document.createElement(tag);
    if (className) made.className = className;
    if (text !== undefined) made.textContent = text;
    return made;
  }

  function entry(name, url, aside, label) {
    const item = element("li");
    const button = element("button", "data-browser-entry");
    button.type = "button";
    button.dataset.url = url;
    if (label) button.setAttribute("aria-label", label);
    button.append(element("span", "name", name));
    if (aside) button.append(element("span", "aside", aside));
    item.append(button);
    return item;
  }

  // The path to the folder shown, each step a way back up; after an error every step is one.
  function showCrumbs(url, listed) {
    const items = [[words.buckets, ""]].concat(steps(url));
    crumbs.replaceChildren(...items.map(([name, target], index) => {
      const item = element("li");
      if (listed && index === items.length - 1) {
        item.append(element("span", "crumb-here", name));
        item.setAttribute("aria-current", "location");
      } else {
        const button = element("button", "crumb", name);
        button.type = "button";
        button.dataset.url = target;
        item.append(button);
      }
      return item;
    }));
  }

  function say(text) { statusLine.textContent = text || ""; }

  function showError(text) {
    errorLine.textContent = text || "";
    errorLine.hidden = !text;
  }

  function render(answer) {
    shown = answer.url || "";
    urlInput.value = shown;
    showCrumbs(shown, true);
    const items = [];
    if (!shown) {
      (answer.buckets || []).forEach((bucket) => items.push(entry(bucket.url, bucket.url, bucket.storage)));
      say(items.length ? "" : words.noStore);
    } else {
      items.push(entry("..", parentOf(shown), "", words.upLabel));
      (answer.folders || []).forEach((url) => {
        const made = steps(url);
        items.push(entry(made[made.length - 1][0] + "/", url));
      });
      (answer.objects || []).forEach((item) => {
        const row = element("li", "data-browser-object");
        row.append(element("span", "name", item.name), element("span", "aside", size(item.size)));
        items.push(row);
      });
      const empty = !(answer.folders || []).length && !(answer.objects || []).length;
      say(empty ? words.empty : answer.more ? words.more : "");
    }
    list.replaceChildren(...items);
    useButton.disabled = !shown;
  }

  function messageOf(result) {
    const body = result && result.body;
    if (body && typeof body === "object") {
      const said = [].concat(body.url || body.detail || body.non_field_errors || []);
      if (said.length) return said.join(" ");
    }
    return words.failed;
  }

  async function go(url, focusList) {
    const mine = ++ticket;
    showError("");
    say(words.loading);
    useButton.disabled = true;
    let result = null;
    try {
      result = await Console.fetchJSON(address(url));
    } catch (error) {
      result = null;
    }
    if (mine !== ticket) return;
    if (result && result.ok && result.body) {
      render(result.body);
      const first = list.querySelector("button");
      if (focusList && first) first.focus();
      return;
    }
    // What was asked stays in the path, to be put right; the buckets are one step up.
    shown = "";
    urlInput.value = url;
    showCrumbs(url, false);
    list.replaceChildren();
    say("");
    showError(messageOf(result));
    if (focusList) urlInput.focus();
  }

  // The folder asked for, of the stores a job of the form's pool may use.
  function address(url) {
    const query = new URLSearchParams();
    if (url) query.set("url", url);
    const pool = document.getElementById("id_pool");
    if (pool && pool.value) query.set("pool", pool.value);
    const text = query.toString();
    return dialog.dataset.apiUrl + (text ? "?" + text : "");
  }

  // A parameter row's name and value fields, where its Browse button is.
  function rowFields(button) {
    const row = button.closest("tr");
    return row ? [row.querySelector('input[name$="_name"]'), row.querySelector('input[name$="_value"]')] : [null, null];
  }

  // A parameter row offers Browse while its name is a further input's.
  function offerInRow(nameInput) {
    const row = nameInput.closest("tr");
    const button = row && row.querySelector("[data-browse-row]");
    if (button) button.hidden = !FURTHER_INPUT.test(nameInput.value.trim());
  }

  function open(button) {
    let title = "";
    if ("browseRow" in button.dataset) {
      const [nameInput, valueInput] = rowFields(button);
      field = valueInput;
      title = nameInput ? nameInput.value.trim() : "";
    } else {
      field = document.getElementById(button.dataset.browseFor);
      const label = field && document.querySelector('label[for="' + field.id + '"]');
      title = label ? label.textContent.trim() : field ? field.name : "";
    }
    if (!field) return;
    opener = button;
    fieldLine.textContent = title;
    newFolder.hidden = !("browseNewFolder" in button.dataset);
    newInput.value = "";
    list.replaceChildren();
    dialog.showModal();
    const start = field.value.trim();
    go(OBJECT_URL.test(start) ? asFolder(start) : "", true);
  }

  function use() {
    if (!shown || !field) return;
    let url = shown;
    const name = newFolder.hidden ? "" : newInput.value.trim().replace(/^\/+|\/+$/g, "");
    if (name) {
      if (name.split("/").some((part) => part === "" || part === "." || part === "..")) {
        showError(words.badSubfolder);
        newInput.focus();
        return;
      }
      url += name + "/";
    }
    field.value = url;
    // The form's command preview follows the field as if it had been typed in.
    field.dispatchEvent(new Event("input", { bubbles: true }));
    field.dispatchEvent(new Event("change", { bubbles: true }));
    dialog.close();
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-browse-for], [data-browse-row]");
    if (button) open(button);
  });

  document.addEventListener("input", (event) => {
    if (event.target.matches && event.target.matches('[data-rows] input[name$="_name"]')) offerInRow(event.target);
  });
  document.querySelectorAll('[data-rows] input[name$="_name"]').forEach(offerInRow);

  dialog.addEventListener("click", (event) => {
    const target = event.target.closest("[data-url], [data-browse-close], [data-browse-use]");
    if (!target) return;
    if (target.matches("[data-browse-close]")) dialog.close();
    else if (target.matches("[data-browse-use]")) use();
    else go(target.dataset.url, true);
  });

  goForm.addEventListener("submit", (event) => {
    event.preventDefault();
    go(urlInput.value.trim() ? asFolder(urlInput.value) : "", true);
  });

  // Up and down arrows move between the entries, as in a list box.
  list.addEventListener("keydown", (event) => {
    if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
    const buttons = Array.from(list.querySelectorAll("button"));
    const at = buttons.indexOf(document.activeElement);
    if (at < 0) return;
    const next = buttons[at + (event.key === "ArrowDown" ? 1 : -1)];
    if (next) { next.focus(); event.preventDefault(); }
  });

  newInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter") { event.preventDefault(); use(); }
  });

  dialog.addEventListener("close", () => {
    ticket += 1;
    if (opener) opener.focus();
  });
})();
