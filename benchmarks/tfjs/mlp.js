// The same MLP training step as benchmarks/interop.py, in TensorFlow.js 4.22 on the CPU backend.
// Usage: node mlp.js STEPS  -> prints {"steps_per_s": ..., "num_tensors": ...} as JSON.
const tf = require("@tensorflow/tfjs");

async function main() {
  await tf.setBackend("cpu");
  const steps = Number(process.argv[2] || 200);
  const [n, hidden] = [256, 32];
  const x = tf.randomUniform([n, 2], -2, 2, "float32", 0);
  const y = tf.tidy(() =>
    tf.add(tf.sin(tf.slice(x, [0, 0], [n, 1])), tf.mul(tf.square(tf.slice(x, [0, 1], [n, 1])), 0.5)));
  const w1 = tf.variable(tf.randomNormal([2, hidden], 0, 0.5, "float32", 1));
  const b1 = tf.variable(tf.zeros([hidden]));
  const w2 = tf.variable(tf.randomNormal([hidden, 1], 0, 0.2, "float32", 2));
  const b2 = tf.variable(tf.zeros([1]));
  const opt = tf.train.adam(0.03);
  const step = () => tf.tidy(() => {
    const loss = opt.minimize(() => {
      const h = tf.tanh(tf.add(tf.matMul(x, w1), b1));
      return tf.mean(tf.square(tf.sub(tf.add(tf.matMul(h, w2), b2), y)));
    }, true);
    return loss;
  });
  for (let i = 0; i < 10; i++) step().dispose();  // warm up
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < steps; i++) step().dispose();
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ steps_per_s: steps / seconds, num_tensors: tf.memory().numTensors }));
}

main();
