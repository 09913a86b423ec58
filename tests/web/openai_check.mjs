// The official OpenAI Node SDK against `corolla api` (tests/api/mp_openai_sdk.cpp):
// node openai_check.mjs BASE_URL API_KEY MODEL ADAPTER PROMPT
// Lists the models, completes PROMPT greedily with the model and with the
// adapter (plain and streamed), chats with the adapter streamed, and asks
// for a model that is not served. Prints one JSON line of what the SDK
// returned; the C++ test compares it with the server's own answers.
import OpenAI from "openai";

const [baseURL, apiKey, model, adapter, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const out = {};

const models = await client.models.list();
out.models = [];
for await (const m of models) out.models.push({ id: m.id, object: m.object, parent: m.parent ?? null });
out.retrieved = (await client.models.retrieve(adapter)).id;

const complete = async (name) => {
  const r = await client.completions.create({ model: name, prompt, max_tokens: 8, temperature: 0 });
  return { model: r.model, text: r.choices[0].text, finish: r.choices[0].finish_reason, usage: r.usage };
};
out.base = await complete(model);
out.adapted = await complete(adapter);

const stream = await client.completions.create({ model: adapter, prompt, max_tokens: 8, temperature: 0, stream: true });
out.streamed = "";
for await (const chunk of stream) {
  out.streamed_model = chunk.model;
  if (chunk.choices.length > 0) out.streamed += chunk.choices[0].text;
}

const chat = await client.chat.completions.create({
  model: adapter,
  messages: [{ role: "user", content: prompt }],
  max_tokens: 6,
  temperature: 0,
  stream: true,
});
out.chat = "";
for await (const chunk of chat) {
  if (chunk.choices.length > 0 && chunk.choices[0].delta.content) out.chat += chunk.choices[0].delta.content;
}

try {
  await client.completions.create({ model: "not-served", prompt, max_tokens: 2 });
  out.unknown = { status: 200 };
} catch (e) {
  out.unknown = { status: e.status ?? null, code: e.code ?? null, is_not_found: e instanceof OpenAI.NotFoundError };
}

console.log(JSON.stringify(out));
