// The creation form: rows added and removed in place, engine versions by engine, code directory upload,
// and the live command preview, which the server computes (this script only shows what it answers).
(function () {
  "use strict";

  const form = document.getElementById("job-form");
  if (!form) return;
  const preview = document.getElementById("command-preview");
  const PREVIEW_DELAY_MS = 250;

  // Rows of name / value ------------------------------------------------------------------------
  function updateAddButtons() {
    form.querySelectorAll("[data-rows]").forEach((table) => {
      const max = parseInt(table.dataset.maxRows || "0", 10);
      const button = form.querySelector('[data-add-row="' + table.dataset.rows + '"]');
      if (button && max) button.disabled = table.querySelectorAll(".row-item").length >= max;
    });
  }

  form.addEventListener("click", (event) => {
    const add = event.target.closest("[data-add-row]");
    if (add) {
      const prefix = add.dataset.addRow;
      const template = form.querySelector('template[data-row-template="' + prefix + '"]');
      const body = form.querySelector('[data-rows="' + prefix + '"] tbody');
      body.appendChild(template.content.cloneNode(true));
      body.lastElementChild.querySelector("input").focus();
      updateAddButtons();
      schedulePreview();
      return;
    }
    const remove = event.target.closest("[data-remove-row]");
    if (remove) {
      remove.closest("tr").remove();
      updateAddButtons();
      schedulePreview();
    }
  });

  // Engine and version ----------------------------------------------------------------------------
  const family = form.querySelector("[data-engine-family]");
  const version = form.querySelector("#id_engine");

  function showVersionsOf(familyId, keepSelection) {
    let firstVisible = null;
    version.querySelectorAll("optgroup").forEach((group) => {
      const visible = group.dataset.engine === familyId;
      group.hidden = !visible;
      group.disabled = !visible;
      if (visible && !firstVisible) firstVisible = group.querySelector("option");
    });
    const selected = version.selectedOptions[0];
    const selectedVisible = selected && selected.value && !selected.parentElement.disabled;
    if (!keepSelection || !selectedVisible) version.value = firstVisible ? firstVisible.value : "";
  }

  if (family) {
    const selected = version.selectedOptions[0];
    if (selected && selected.parentElement.dataset.engine) family.value = selected.parentElement.dataset.engine;
    showVersionsOf(family.value, true);
    family.addEventListener("change", () => { showVersionsOf(family.value, false); schedulePreview(); });
  }

  // Auto stop -------------------------------------------------------------------------------------
  const autoStop = form.querySelector("[data-auto-stop]");
  const autoStopCustom = form.querySelector("[data-auto-stop-custom]");
  function showCustomHours() { autoStopCustom.hidden = autoStop.value !== "custom"; }
  autoStop.addEventListener("change", showCustomHours);
  showCustomHours();

  // Live preview ----------------------------------------------------------------------------------
  let timer = null;
  let latest = 0;

  function schedulePreview() {
    clearTimeout(timer);
    timer = setTimeout(refreshPreview, PREVIEW_DELAY_MS);
  }

  function labelOf(field) {
    const label = form.querySelector('label[for="id_' + field + '"]') ||
      form.querySelector("#section-" + (field === "parameters" ? "parameters" : field) + " h2");
    return label ? label.textContent.trim() : field;
  }

  function setText(key, text) {
    preview.querySelectorAll('[data-preview="' + key + '"]').forEach((node) => { node.textContent = text; });
  }

  // A code directory with exactly one Python file has only one possible boot file: it is filled in,
  // unless the user has typed one already.
  function showBootFiles(files) {
    const list = document.getElementById("boot-files");
    list.replaceChildren(...files.map((file) => { const option = document.createElement("option"); option.value = file; return option; }));
    const boot = form.querySelector("#id_boot_file");
    if (files.length === 1 && !boot.value.trim()) {
      boot.value = files[0];
      boot.dispatchEvent(new Event("input", { bubbles: true }));
    }
  }

  // The limit in the words the form's error would use, so hint and error never disagree.
  function showNodeLimit(answer) {
    const input = form.querySelector("#id_node_count");
    const hint = form.querySelector("[data-node-hint]");
    if (!answer.max_nodes) return;
    input.max = answer.max_nodes;
    const bySpec = answer.nodes_in_pool > 0 && answer.max_nodes < answer.nodes_in_pool;
    const limit = bySpec ? Console.fillTemplate(hint.dataset.specTemplate, { max: answer.max_nodes })
      : Console.fillTemplate(hint.dataset.poolTemplate, { count: answer.nodes_in_pool });
    hint.textContent = limit + " " + hint.dataset.single;
  }

  // Fields still empty are named plainly; fields that are wrong get their message.
  function showProblems(answer) {
    const list = preview.querySelector("[data-preview-problems]");
    const needed = preview.querySelector("[data-preview-needed]");
    const empty = answer.empty || [];
    const problems = [];
    (answer.blocking || []).filter((field) => !empty.includes(field)).forEach((field) => {
      (answer.errors[field] || []).forEach((message) => problems.push(labelOf(field) + ": " + message));
    });
    list.replaceChildren(...problems.map((text) => { const item = document.createElement("li"); item.textContent = text; return item; }));
    list.hidden = problems.length === 0;
    const emptyBlocking = (answer.blocking || []).filter((field) => empty.includes(field));
    needed.textContent = Console.fillTemplate(needed.dataset.template, { fields: emptyBlocking.map(labelOf).join(", ") });
    needed.hidden = emptyBlocking.length === 0;
  }

  async function refreshPreview() {
    const ticket = ++latest;
    preview.classList.add("loading");
    let result;
    try {
      result = await Console.fetchJSON(form.dataset.previewUrl, { method: "POST", body: new FormData(form) });
    } catch (error) {
      return;
    } finally {
      if (ticket === latest) preview.classList.remove("loading");
    }
    // An older answer arriving after a newer one would show a command the form no longer describes.
    if (ticket !== latest || !result.ok || !result.body) return;
    const answer = result.body;
    form.querySelector("[data-working-dir]").value = answer.working_dir || "";
    showBootFiles(answer.boot_files || []);
    showNodeLimit(answer);
    showProblems(answer);
    preview.classList.toggle("stale", !answer.ready);
    preview.dataset.ready = answer.ready ? "true" : "false";
    if (answer.ready) {
      setText("np", String(answer.np));
      setText("template", answer.template);
      setText("expanded", answer.expanded);
      setText("hostfile", answer.hostfile);
      const shape = preview.querySelector('[data-preview="shape"]');
      const nodes = answer.hostfile.split("\n").filter(Boolean).length;
      shape.textContent = Console.fillTemplate(shape.dataset.template, { nodes: nodes, slots: answer.processes_per_node });
    }
  }

  form.addEventListener("input", schedulePreview);
  form.addEventListener("change", schedulePreview);

  // Code directory upload ------------------------------------------------------------------------
  const upload = document.getElementById("code-dir-upload");
  const archiveInput = document.getElementById("id_upload_archive");
  const uploadName = document.getElementById("id_upload_name");
  const uploadStatus = form.querySelector("[data-upload-status]");

  archiveInput.addEventListener("change", () => {
    const file = archiveInput.files[0];
    if (file && !uploadName.value) {
      uploadName.value = file.name.replace(/\.(zip|tar\.gz|tgz)$/i, "").replace(/[^A-Za-z0-9_-]+/g, "-").slice(0, 64);
    }
  });

  function showUploadErrors(errors) {
    form.querySelectorAll("[data-upload-errors]").forEach((list) => {
      const messages = errors[list.dataset.uploadErrors] || [];
      list.replaceChildren(...messages.map((text) => { const item = document.createElement("li"); item.textContent = text; return item; }));
      list.hidden = messages.length === 0;
    });
  }

  upload.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector('button[form="code-dir-upload"]');
    const idle = button.textContent;
    button.disabled = true;
    button.textContent = button.dataset.busyLabel;
    uploadStatus.textContent = "";
    try {
      const result = await Console.fetchJSON(upload.action, { method: "POST", body: new FormData(upload) });
      if (!result.ok) {
        showUploadErrors(result.body || { archive: [String(result.status)] });
        return;
      }
      showUploadErrors({});
      const created = result.body;
      const select = form.querySelector("#id_code_dir");
      const option = document.createElement("option");
      option.value = created.id;
      option.dataset.name = created.name;
      option.textContent = created.name;
      select.appendChild(option);
      select.value = String(created.id);
      uploadStatus.textContent = uploadStatus.dataset.doneLabel;
      schedulePreview();
    } finally {
      button.disabled = false;
      button.textContent = idle;
    }
  });

  updateAddButtons();
  refreshPreview();

  // Names need not be unique, but the list tells jobs apart by name: a name the user has used says so. The
  // server is asked (a little after the typing stops), so the page carries none of the user's job names.
  const nameInput = form.querySelector("#id_name");
  const takenHint = form.querySelector("[data-name-taken]");
  if (nameInput && takenHint) {
    let asked = 0, timer = null;
    const checkName = async () => {
      const name = nameInput.value.trim();
      const question = ++asked;
      if (!name) {
        takenHint.hidden = true;
        return;
      }
      const result = await Console.fetchJSON(takenHint.dataset.url + "?name=" + encodeURIComponent(name));
      if (question !== asked) return;  // a later name was typed meanwhile
      takenHint.hidden = !(result.ok && result.body && result.body.taken);
      takenHint.textContent = Console.fillTemplate(takenHint.dataset.template, { name: name });
    };
    nameInput.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(checkName, 250);
    });
    checkName();
  }

  // After a refused submission the first wrong field (or row) has the focus, scrolled into view.
  const firstError = form.querySelector(".errorlist:not([hidden])");
  if (firstError) {
    const holder = firstError.closest("td, .field, section") || firstError.parentElement;
    const target = holder.querySelector("input:not([type=hidden]), select, textarea") || holder;
    target.scrollIntoView({ block: "center" });
    if (target.focus) target.focus({ preventScroll: true });
  }
})();
