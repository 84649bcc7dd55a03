// The API reference page (/docs): Swagger UI on /openapi.json.
//
// Tokens work as on the dashboard: the token pasted there (or here) is kept in localStorage under
// the same key and sent as "Authorization: Bearer" with the document request and with every
// "Try it out" call that does not carry its own (a job token entered with "Authorize" wins).
// A 401 on the document opens the token form.
(() => {
  "use strict";

  const TOKEN_KEY = "torchyard.token";  // the dashboard's key: one token for both pages
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  const message = document.getElementById("token-message");

  function askForToken(text) {
    message.textContent = text;
    form.hidden = false;
    input.focus();
  }

  function withToken(req) {
    const token = localStorage.getItem(TOKEN_KEY);
    const has = Object.keys(req.headers || {}).some((k) => k.toLowerCase() === "authorization");
    if (token && !has) req.headers = {...req.headers, Authorization: `Bearer ${token}`};
    return req;
  }

  function onResponse(res) {
    if (res.status === 401 && new URL(res.url, location.href).pathname === "/openapi.json") {
      askForToken(localStorage.getItem(TOKEN_KEY)
        ? "The API token was refused (401): paste another one."
        : "This server needs an API token (401): paste one to continue.");
    }
    return res;
  }

  document.getElementById("token-button").addEventListener("click", () => {
    form.hidden = !form.hidden;
    message.textContent = localStorage.getItem(TOKEN_KEY) ? "API token (one is saved)" : "API token";
  });
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (input.value.trim()) localStorage.setItem(TOKEN_KEY, input.value.trim());
    location.reload();
  });
  document.getElementById("token-clear").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    location.reload();
  });

  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,  // the default badge calls validator.swagger.io: nothing leaves this host
    requestInterceptor: withToken,
    responseInterceptor: onResponse,
  });
})();
