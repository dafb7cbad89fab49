// chargpt playground: the client of the server's JSON API (chargpt/web/endpoints/): JSON requests, and a
// generation read as server-sent events as it arrives.

export async function api(path, body) {
  const init = body === undefined ? {} : {method: "POST", headers: {"Content-Type": "application/json"},
                                          body: JSON.stringify(body)};
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
  const response = await fetch("/api/generate", {method: "POST", headers: {"Content-Type": "application/json"},
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
