// Drives the real, unmodified E2B SDK through E2B's users: commands and
// files as `user` by default, as root when asked, and the owners that
// files.list and getInfo report. Usage as compat.mjs; run by
// internal/front/e2b's TestRealSDKUser.
import assert from 'node:assert/strict'

const mod = process.argv[2] || 'e2b'
const { Sandbox, CommandExitError } = await import(mod)

function ok(name) { console.log(`ok ${mod} ${name}`) }

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
try {
  let r = await sbx.commands.run('whoami; id -u; echo "$HOME $USER"; pwd')
  assert.equal(r.stdout, 'user\n1000\n/home/user user\n/home/user\n')
  r = await sbx.commands.run('whoami; id -u; echo "$HOME $USER"; pwd', { user: 'root' })
  assert.equal(r.stdout, 'root\n0\n/root root\n/root\n')
  r = await sbx.commands.run('whoami', { user: 'user', cwd: '/tmp' })
  assert.equal(r.stdout, 'user\n')
  // As user, root's files are out of reach, as in E2B.
  try {
    await sbx.commands.run('touch /root/nope')
    assert.fail('user wrote into /root')
  } catch (e) {
    assert.ok(e instanceof CommandExitError, `${e?.constructor?.name}: ${e?.message}`)
  }
  const bg = await sbx.commands.run('whoami; sleep 0.1', { background: true, user: 'root' })
  r = await bg.wait()
  assert.equal(r.stdout, 'root\n')
  ok('commands run as user by default, as root when asked')

  await sbx.files.write('/home/user/mine/a.txt', 'a')
  await sbx.files.write('/tmp/rootdir/b.txt', 'b', { user: 'root' })
  r = await sbx.commands.run('stat -c %U:%G /home/user/mine /home/user/mine/a.txt /tmp/rootdir /tmp/rootdir/b.txt')
  assert.equal(r.stdout, 'user:user\nuser:user\nroot:root\nroot:root\n')
  const list = await sbx.files.list('/home/user/mine')
  assert.deepEqual(list.map((x) => [x.name, x.owner, x.group]), [['a.txt', 'user', 'user']])
  let info = await sbx.files.getInfo('/home/user/mine/a.txt')
  assert.equal(info.owner, 'user')
  assert.equal(info.group, 'user')
  info = await sbx.files.getInfo('/tmp/rootdir/b.txt')
  assert.equal(info.owner, 'root')
  assert.equal(info.group, 'root')
  // A file bigger than the front holds in memory streams through a
  // process of the user's.
  const big = new Uint8Array(3 << 20).fill(7)
  await sbx.files.write('/home/user/mine/big.bin', new Blob([big]).stream())
  info = await sbx.files.getInfo('/home/user/mine/big.bin')
  assert.equal(info.owner, 'user')
  assert.equal(info.size, big.length)
  ok('files.write owned by its user; list and getInfo report owner and group')
} finally {
  await sbx.kill()
}
console.log(`PASS ${mod}`)
