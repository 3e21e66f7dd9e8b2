// Drives the unmodified @e2b/code-interpreter client against clade's E2B
// front (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY); prints PASS codeint.
import { Sandbox } from '@e2b/code-interpreter'

function check(cond, what) {
  if (!cond) throw new Error('FAIL: ' + what)
  console.log('ok', what)
}

const sbx = await Sandbox.create({ timeoutMs: 300_000 })
try {
  check(sbx.sandboxId, 'created ' + sbx.sandboxId)
  let ex = await sbx.runCode('x = 41\nx + 1')
  check(ex.text === '42', 'main result ' + ex.text)
  ex = await sbx.runCode('x')
  check(ex.text === '41', 'state kept')
  const lines = []
  ex = await sbx.runCode('import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)', { onStdout: (m) => lines.push(m.line) })
  check(lines.join('') === '0\n1\n2\n' && ex.logs.stdout.join('') === '0\n1\n2\n', 'stdout in order ' + JSON.stringify(lines))
  ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
  check(ex.results.some((r) => r.png && Buffer.from(r.png, 'base64').subarray(1, 4).toString() === 'PNG'), 'matplotlib PNG')
  ex = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
  check(ex.results[0].html.includes('<table') && ex.results[0].isMainResult, 'DataFrame HTML')
  ex = await sbx.runCode('def f():\n    return 1/0\nf()')
  check(ex.error && ex.error.name === 'ZeroDivisionError' && ex.error.traceback.replace(/\x1b\[[0-9;]*m/g, '').includes('f()'), 'traceback ' + JSON.stringify(ex.error))
  let timedOut = false
  try {
    await sbx.runCode('import time\nwhile True: time.sleep(0.1)', { timeoutMs: 1000 })
  } catch (e) {
    timedOut = e.name === 'TimeoutError' || /timed out/i.test(e.message)
  }
  check(timedOut, 'timeout')
  ex = await sbx.runCode('x * 2')
  check(ex.text === '82', 'context lives after the timeout: ' + ex.text + ' ' + JSON.stringify(ex.error))
  ex = await sbx.runCode("import os\nos.environ['FOO']", { envs: { FOO: 'bar' } })
  check(ex.text === "'bar'", 'envs')
  const a = await sbx.createCodeContext({ language: 'python' })
  const b = await sbx.createCodeContext()
  await sbx.runCode('v = "a"', { context: a })
  await sbx.runCode('v = "b"', { context: b })
  const va = await sbx.runCode('v', { context: a })
  const vb = await sbx.runCode('v', { context: b })
  check(va.text === "'a'" && vb.text === "'b'", 'two contexts isolated')
  const list = await sbx.listCodeContexts()
  check(list.some((c) => c.id === a.id), 'contexts listed')
  await sbx.restartCodeContext(a)
  ex = await sbx.runCode('v', { context: a })
  check(ex.error && ex.error.name === 'NameError', 'restart clears')
  await sbx.removeCodeContext(b)
  ex = await sbx.runCode('echo $((2+3))', { language: 'bash' })
  check(ex.logs.stdout.join('') === '5\n', 'bash')
  ex = await sbx.runCode('[1,2].map(x => x * 2)', { language: 'js' })
  check(ex.text === '[ 2, 4 ]', 'js ' + ex.text)
  console.log('PASS codeint')
} finally {
  await sbx.kill()
}
