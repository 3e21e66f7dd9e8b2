// Times E2B SDK calls against a clade daemon's E2B front, for
// internal/front/e2b's benchmark. Usage: node bench.mjs run|create N.
// Prints {"ms": [...]}: one duration per call, in milliseconds.
import { Sandbox } from 'e2b'

const [op, n] = [process.argv[2], Number(process.argv[3] || 10)]
const ms = []
if (op === 'run') {
  const sbx = await Sandbox.create()
  try {
    await sbx.commands.run('true') // the first call opens the connection
    for (let i = 0; i < n; i++) {
      const t = performance.now()
      await sbx.commands.run('true')
      ms.push(performance.now() - t)
    }
  } finally {
    await sbx.kill()
  }
} else if (op === 'create') {
  for (let i = 0; i < n; i++) {
    const t = performance.now()
    const sbx = await Sandbox.create()
    ms.push(performance.now() - t)
    await sbx.kill()
  }
} else {
  throw new Error(`unknown op ${op}: use run or create`)
}
console.log(JSON.stringify({ ms }))
