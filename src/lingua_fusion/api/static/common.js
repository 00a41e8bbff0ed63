// What both pages share: the API key kept in this tab (sessionStorage, never a URL), JSON requests with it in a
// header, and small DOM helpers. No framework, no build step.
"use strict";

const LF = {
  keyName: "linguafusion.key",

  key(name) {
    return sessionStorage.getItem(name || LF.keyName) || "";
  },

  setKey(value, name) {
    const k = (value || "").trim();
    if (k) sessionStorage.setItem(name || LF.keyName, k);
    else sessionStorage.removeItem(name || LF.keyName);
  },

  // Ask for the key once (a <dialog> with a password field); resolves with the key, or "" if dismissed.
  askKey(dialog, name, message) {
    return new Promise((resolve) => {
      const input = dialog.querySelector("input");
      const note = dialog.querySelector(".key-message");
      if (note) note.textContent = message || "";
      input.value = "";
      dialog.returnValue = "";
      dialog.addEventListener("close", () => {
        if (dialog.returnValue === "ok") LF.setKey(input.value, name);
        resolve(LF.key(name));
      }, { once: true });
      dialog.showModal();
      input.focus();
    });
  },

  // fetch with the key in the Authorization header; JSON errors become Error objects with .code and .status.
  async request(path, options, name) {
    const opts = Object.assign({ method: "GET" }, options || {});
    const key = LF.key(name);
    opts.headers = Object.assign({}, opts.headers || {}, key ? { Authorization: "Bearer " + key } : {});
    const response = await fetch(path, opts);
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) {
      const err = (body && body.error) || {};
      const e = new Error(err.message || ("HTTP " + response.status));
      e.code = err.code || "http_" + response.status;
      e.status = response.status;
      throw e;
    }
    return body;
  },

  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  },

  clock(seconds) {  // 1:02.3 (minutes:seconds.tenths), for the page
    const tenths = Math.max(0, Math.round(seconds * 10));
    return `${Math.floor(tenths / 600)}:${String(Math.floor(tenths / 10) % 60).padStart(2, "0")}.${tenths % 10}`;
  },

  fmtTime(seconds, sep) {  // 00:01:02,345 (SRT) or with sep "."
    const ms = Math.max(0, Math.round(seconds * 1000));
    const h = Math.floor(ms / 3600000), m = Math.floor(ms / 60000) % 60, s = Math.floor(ms / 1000) % 60;
    const pad = (n, w) => String(n).padStart(w || 2, "0");
    return `${pad(h)}:${pad(m)}:${pad(s)}${sep || ","}${pad(ms % 1000, 3)}`;
  },
};
