// Checks that E2B's `base` template on clade holds what E2B's own does.
// Usage: node base.mjs MODULE, with E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL set. Run by internal/front/e2b's TestBaseTemplate.
import assert from 'node:assert/strict'

const mod = process.argv[2] || 'e2b'
const { Sandbox } = await import(mod)

const sbx = await Sandbox.create() // the SDK's default template: base
try {
  assert.equal(sbx.templateId ?? 'base', 'base')
  // Every tool E2B code reaches for, each answering with its version.
  const tools = {
    'git --version': /^git version /,
    'curl --version': /^curl /,
    'wget --version': /GNU Wget/,
    'node -v': /^v\d+\./,
    'npm -v': /^\d+\./,
    'python --version': /^Python 3\./,
    'python3 --version': /^Python 3\./,
    'pip --version': /^pip /,
    'ps': /PID/,
    'ps -e -o comm=': /\S/,
    'sudo -n true && echo sudo-ran': /^sudo-ran$/,
    'whoami': /^user$/, // E2B runs commands as its user
    'echo $HOME': /^\/home\/user$/,
    'id -u user': /^1000$/,
    'sudo -n whoami': /^root$/,
    'pwd': /^\/home\/user$/,
    'stat -c %u:%g /home/user': /^1000:1000$/,
  }
  for (const [cmd, want] of Object.entries(tools)) {
    const r = await sbx.commands.run(cmd)
    assert.equal(r.exitCode, 0, `${cmd}: exit ${r.exitCode}: ${r.stderr}`)
    assert.match(r.stdout.trim(), want, `${cmd} printed ${JSON.stringify(r.stdout)}`)
    console.log(`ok ${mod} ${cmd}`)
  }
  // root when asked, as E2B.
  const r = await sbx.commands.run('whoami', { user: 'root' })
  assert.equal(r.stdout.trim(), 'root')
  const list = await Sandbox.list()
  const items = list.nextItems ? await list.nextItems() : list
  const me = items.find((s) => s.sandboxId === sbx.sandboxId)
  assert.equal(me?.templateId, 'base', `listed template ${me?.templateId}`)
  console.log(`PASS ${mod}`)
} finally {
  await sbx.kill()
}
