// chargpt playground: the client of the server's JSON API (chargpt/web/endpoints/): JSON requests, and a
// generation read as server-sent events as it arrives.

const KEY = "chargpt-api-key";

function keepKey() {
  // a server that asks for a key (chargpt serve --api-key, or one it made) prints the page's address with
  // ?token=KEY: the page keeps the key for this tab and takes it out of the address bar, so that it is not
  // bookmarked, kept in the history or shown over a shoulder; every request then sends it as a Bearer token
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token === null) return;
  try { sessionStorage.setItem(KEY, token); } catch (err) { /* storage off: the key lasts until a reload */ }
  keepKey.key = token;
  url.searchParams.delete("token");
  window.history.replaceState(null, "", url.pathname + url.search + url.hash);
}
keepKey();

export function withKey(headers = {}) {
  let key = keepKey.key;
  try { key = sessionStorage.getItem(KEY) ?? key; } catch (err) { /* as above */ }
  return key ? {...headers, Authorization: `Bearer ${key}`} : headers;
}

export async function api(path, body) {
  const init = body === undefined ? {headers: withKey()} : {method: "POST", body: JSON.stringify(body),
                                                           headers: withKey({"Content-Type": "application/json"})};
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({error: `${response.status} ${response.statusText}`}));
  if (!response.ok) throw Object.assign(new Error(data.error || response.statusText), {data});
  return data;
}

async function* sseEvents(response) {
  // server-sent events from a POST: "event: NAME\ndata: JSON\n\n", read as it arrives
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      yield {event, data: JSON.parse(data)};
    }
  }
}

export async function generate(body, onStart, onText) {
  // -> the `done` event; throws with the server's message when the request is refused
  const response = await fetch("/api/generate", {method: "POST", headers: withKey({"Content-Type": "application/json"}),
                                                 body: JSON.stringify(body)});
  if (!response.ok) {
    const data = await response.json().catch(() => ({error: response.statusText}));
    throw Object.assign(new Error(data.error), {data});
  }
  for await (const {event, data} of sseEvents(response)) {
    if (event === "start") onStart(data);
    else if (event === "text") onText(data);
    else if (event === "done") return data;
  }
  return {stopped: true, chars: 0, error: "the connection closed early"};
}
