#!/usr/bin/env node
// Runs tidy/keep/dispose/clone programs in TensorFlow.js itself (the pure-JS CPU backend) and
// prints what TF.js's memory books say after every statement. The reference side of
// tests/test_tfjs_differential.py.
//
// Input (stdin, or the file named by the first argument): a JSON list of programs; a program is
// a list of statements, each an object with an "op" field (see `step` below). Output (stdout):
// {"version": "4.22.0", "results": [...]}, with for each program {"trace": [[numTensors,
// numDataBuffers, liveNames, rejected], ...], "error": null | {"index": i, "message": "..."}}.
// The counts are relative to the program's start; liveNames are the sorted names of the
// program's tensors TF.js still considers alive (not disposed; for a variable, also still
// registered: tf.disposeVariables() unregisters a variable without marking the object disposed);
// rejected is true for a "try_clone" that TF.js refused ("Tensor is disposed"), false otherwise.
// Any other error stops the program.
//
// A scope's result ("exit") and the argument of "dispose_tree" (tf.dispose) are a name, or
// nested arrays and objects of names, built into the same arrays and objects of tensors.
//
//   node tests/tfjs/run_program.js programs.json
//   echo '[[{"op": "create", "out": "t0", "values": [1, 2]}]]' | node tests/tfjs/run_program.js

"use strict";

const fs = require("fs");

// TF.js greets Node users on stdout (console.log); stdout carries only the JSON result.
console.log = console.error;
console.warn = console.error;
console.info = console.error;

const tf = require("@tensorflow/tfjs");

const OPS = {
  add: (x, y) => tf.add(x, y),
  mul: (x, y) => tf.mul(x, y),
  neg: (x) => tf.neg(x),
  square: (x) => tf.square(x),
};

function counts() {
  const m = tf.memory();
  // tf.memory() copies the engine's own counters; read the engine too, to be sure they agree.
  const state = tf.engine().state;
  if (m.numTensors !== state.numTensors || m.numDataBuffers !== state.numDataBuffers) {
    throw new Error("tf.memory() and tf.engine().state disagree");
  }
  return [m.numTensors, m.numDataBuffers];
}

function isAlive(env, name) {
  const t = env.get(name);
  if (t.isDisposed) return false;
  if (t instanceof tf.Variable) return tf.engine().registeredVariables[t.name] === t;
  return true;
}

function get(env, name) {
  if (!env.has(name)) throw new Error(`name ${name} is not defined`);
  if (!isAlive(env, name)) throw new Error(`tensor ${name} is disposed`);
  return env.get(name);
}

function define(env, name, value) {
  if (env.has(name)) throw new Error(`name ${name} is defined twice`);
  env.set(name, value);
}

// The tensor of a name, alive or not: tf.keep, tf.dispose and a scope's result take any tensor.
function defined(env, name) {
  if (!env.has(name)) throw new Error(`name ${name} is not defined`);
  return env.get(name);
}

// A tree of names: the same arrays and objects, of tensors.
function tree(env, names) {
  if (names === null || names === undefined) return undefined;
  if (typeof names === "string") return defined(env, names);
  if (Array.isArray(names)) return names.map((n) => tree(env, n));
  const out = {};
  for (const [k, n] of Object.entries(names)) out[k] = tree(env, n);
  return out;
}

// Runs one statement; true if TF.js rejected it (only "try_clone" may be).
function step(env, engine, st) {
  switch (st.op) {
    case "create":
      define(env, st.out, tf.tensor(st.values));
      break;
    case "unary":
      define(env, st.out, OPS[st.fn](get(env, st.x)));
      break;
    case "binary":
      define(env, st.out, OPS[st.fn](get(env, st.x), get(env, st.y)));
      break;
    case "clone":
      define(env, st.out, get(env, st.x).clone());
      break;
    case "try_clone": {
      // Tensor.clone() of a disposed tensor throws (throwIfDisposed) before touching anything.
      const x = defined(env, st.x);
      let y;
      try {
        y = x.clone();
      } catch (e) {
        if (x.isDisposed && String(e && e.message) === "Tensor is disposed.") return true;
        throw e;
      }
      define(env, st.out, y);
      break;
    }
    case "dispose":
      // Disposing twice is allowed (a no-op), so a disposed name may be disposed again.
      defined(env, st.x).dispose();
      break;
    case "dispose_tree":
      tf.dispose(tree(env, st.xs));
      break;
    case "keep":
      // Engine.keep sets the flag whatever the tensor's state: a disposed one may be kept.
      tf.keep(defined(env, st.x));
      break;
    case "enter":
      // What tf.tidy(name, fn) does before fn runs (engine.js: tidy -> scopedRun -> startScope).
      engine.startScope(st.name);
      break;
    case "exit":
      // ... and after: endScope(result) disposes what the scope tracked, except the result and
      // kept tensors, and hands the result to the enclosing scope.
      engine.endScope(tree(env, st.result));
      break;
    case "variable":
      define(env, st.out, tf.variable(get(env, st.x)));
      break;
    case "assign":
      get(env, st.var).assign(get(env, st.x));
      break;
    case "dispose_variables":
      tf.disposeVariables();
      break;
    default:
      throw new Error(`unknown statement ${JSON.stringify(st)}`);
  }
  return false;
}

function run(program) {
  const engine = tf.engine();
  const env = new Map();
  const depth = engine.state.scopeStack.length;
  const [t0, b0] = counts();
  const trace = [];
  let error = null;
  for (let i = 0; i < program.length; i++) {
    let rejected;
    try {
      rejected = step(env, engine, program[i]);
    } catch (e) {
      error = { index: i, message: String(e && e.message ? e.message : e) };
      break;
    }
    const [t, b] = counts();
    const live = [...env.keys()].filter((n) => isAlive(env, n)).sort();
    trace.push([t - t0, b - b0, live, rejected]);
  }
  // Reset: close what the program left open, then free everything it made.
  while (engine.state.scopeStack.length > depth) engine.endScope();
  tf.disposeVariables();
  for (const [, t] of env) {
    if (!(t instanceof tf.Variable)) t.dispose();
  }
  return { trace, error };
}

async function main() {
  await tf.setBackend("cpu");
  await tf.ready();
  if (tf.getBackend() !== "cpu") throw new Error(`backend is ${tf.getBackend()}, not cpu`);
  const source = process.argv.length > 2 ? fs.readFileSync(process.argv[2], "utf8")
    : fs.readFileSync(0, "utf8");
  const programs = JSON.parse(source);
  const out = programs.map(run);
  process.stdout.write(JSON.stringify({ version: tf.version.tfjs, results: out }) + "\n");
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
