// The client side of tests/serve/openai_test.cc: OpenAI's own Node.js SDK
// (package.json pins it) against a running `cohort serve`.
//   node client.mjs BASE_URL API_KEY MODEL PROMPT
// Runs completions, chat, streaming, n = 2, stop strings, logprobs, the
// model list and the errors the SDK raises, and prints what it got as one
// JSON object on stdout for the test to check.
import OpenAI, { AuthenticationError, BadRequestError, NotFoundError } from 'openai';

const [baseURL, apiKey, model, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
const out = {};

// A streamed answer's texts joined per choice, its finish reasons, its usage.
async function collect(stream, chat) {
  const texts = [], finish = [];
  let usage = null, chunks = 0, role = null;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const piece = chat ? (c.delta.content ?? '') : c.text;
      if (chat && c.delta.role) role = c.delta.role;
      texts[c.index] = (texts[c.index] ?? '') + piece;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  return { texts, finish, usage, chunks, role };
}

function errorOf(e) {
  return {
    name: e.constructor.name, status: e.status, type: e.type, code: e.code, param: e.param,
    message: e.message, notFound: e instanceof NotFoundError, authentication: e instanceof AuthenticationError,
    badRequest: e instanceof BadRequestError,
  };
}

async function refused(call) {
  try {
    await call();
    return { name: 'none' };
  } catch (e) {
    return errorOf(e);
  }
}

const greedy = { model, prompt, max_tokens: 20, temperature: 0 };
const c = await client.completions.create(greedy);
out.completion = { object: c.object, model: c.model, text: c.choices[0].text,
                   finish: c.choices[0].finish_reason, usage: c.usage };

const s = await client.completions.create({ ...greedy, stream: true, stream_options: { include_usage: true } });
out.completionStream = await collect(s, false);

// A stop string: two characters of the greedy text where they first occur.
const text = c.choices[0].text;
let at = 4;
while (at + 2 < text.length && text.indexOf(text.slice(at, at + 2)) !== at) at++;
out.stop = text.slice(at, at + 2);
const cut = await client.completions.create({ ...greedy, stop: ['never here', out.stop] });
out.stopped = { text: cut.choices[0].text, finish: cut.choices[0].finish_reason };
out.stoppedStream = await collect(await client.completions.create({ ...greedy, stop: out.stop, stream: true }), false);

const two = await client.completions.create({ model, prompt, max_tokens: 12, n: 2, temperature: 1, seed: 5 });
out.n2 = { texts: two.choices.map((x) => x.text), indexes: two.choices.map((x) => x.index), usage: two.usage };
out.n2Seed6 = (await client.completions.create({ model, prompt, max_tokens: 12, temperature: 1, seed: 6 }))
  .choices[0].text;
out.n2Stream = await collect(await client.completions.create(
  { model, prompt, max_tokens: 12, n: 2, temperature: 1, seed: 5, stream: true }), false);

const lp = await client.completions.create({ ...greedy, max_tokens: 4, logprobs: 2 });
out.logprobs = lp.choices[0].logprobs;
out.logprobsText = lp.choices[0].text;

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: prompt }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0,
                                                     logprobs: true, top_logprobs: 2 });
out.chat = { object: chat.object, message: chat.choices[0].message, finish: chat.choices[0].finish_reason,
             usage: chat.usage, logprobs: chat.choices[0].logprobs };
out.chatStream = await collect(await client.chat.completions.create(
  { model, messages, max_tokens: 20, temperature: 0, stream: true, n: 2 }), true);

out.models = (await client.models.list()).data.map((m) => m.id);
out.retrieved = (await client.models.retrieve(model)).id;

out.unknownModel = await refused(() => client.completions.create({ ...greedy, model: 'no-such-model' }));
out.unknownChatModel = await refused(() => client.chat.completions.create({ model: 'gpt-4o', messages }));
out.badKey = await refused(() => new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 }).completions.create(greedy));
out.noContent = await refused(() => client.chat.completions.create({ model, messages: [{ role: 'user' }] }));
out.tooMany = await refused(() => client.completions.create({ ...greedy, n: 1000 }));
out.negative = await refused(() => client.completions.create({ ...greedy, max_tokens: -1 }));
out.tooLong = await refused(() => client.completions.create({ ...greedy, prompt: 'x'.repeat(5000) }));

// A client that leaves mid-stream: the server must end that generation.
const long = await client.completions.create({ model, prompt, max_tokens: 1000, temperature: 1, stream: true });
let seen = 0;
for await (const chunk of long) {
  if (++seen >= 3) break;  // breaking out of the loop aborts the request
}
out.abandonedAfter = seen;

console.log(JSON.stringify(out));
