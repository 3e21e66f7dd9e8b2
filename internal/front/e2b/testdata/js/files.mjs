// Drives the real, unmodified E2B SDK through E2B's file behaviour:
// signed file URLs (downloadUrl, uploadUrl, expiry, a bad signature, a
// signature of another sandbox), removing a missing path, listings sorted
// by name, symlink targets, and makeDir/rename/remove as the user. Usage
// as compat.mjs; run by internal/front/e2b's TestRealSDKFiles.
import assert from 'node:assert/strict'

const mod = process.argv[2] || 'e2b'
const { Sandbox } = await import(mod)

function ok(name) { console.log(`ok ${mod} ${name}`) }

const sbx = await Sandbox.create({ timeoutMs: 120_000, secure: true })
const other = await Sandbox.create({ timeoutMs: 120_000 })
try {
  // Signed URLs: fetched as anyone would, with no header at all. The URL
  // is on E2B_SANDBOX_URL, so it names no sandbox.
  await sbx.files.write('/home/user/dl.txt', 'signed bytes')
  let url = await sbx.downloadUrl('/home/user/dl.txt')
  assert.match(url, /[?&]signature=v1_/)
  let res = await fetch(url)
  assert.equal(res.status, 200, await res.clone().text())
  assert.equal(await res.text(), 'signed bytes')

  url = await sbx.downloadUrl('/home/user/dl.txt', { useSignatureExpiration: 60 })
  assert.match(url, /signature_expiration=\d+/)
  res = await fetch(url)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'signed bytes')

  // Upload: multipart POST to the signed URL, written as the default user.
  url = await sbx.uploadUrl('/home/user/up/new.txt')
  const form = new FormData()
  form.append('file', new Blob(['uploaded']), 'new.txt')
  res = await fetch(url, { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.clone().text())
  assert.equal(await sbx.files.read('/home/user/up/new.txt'), 'uploaded')
  let r = await sbx.commands.run('stat -c %U /home/user/up/new.txt')
  assert.equal(r.stdout, 'user\n')

  // Expired: envd's message, 401.
  url = await sbx.downloadUrl('/home/user/dl.txt', { useSignatureExpiration: -10 })
  res = await fetch(url)
  assert.equal(res.status, 401)
  assert.match((await res.json()).message, /signature is already expired/)

  // Tampered: another path under the same signature, a changed expiry,
  // a signature for read used to write, a made-up one.
  url = new URL(await sbx.downloadUrl('/home/user/dl.txt'))
  url.searchParams.set('path', '/etc/shadow')
  res = await fetch(url)
  assert.equal(res.status, 401)
  assert.match((await res.json()).message, /invalid signature/)
  url = new URL(await sbx.downloadUrl('/home/user/dl.txt', { useSignatureExpiration: 60 }))
  url.searchParams.set('signature_expiration', String(Number(url.searchParams.get('signature_expiration')) + 3600))
  res = await fetch(url)
  assert.equal(res.status, 401)
  url = await sbx.downloadUrl('/home/user/up/new.txt')
  res = await fetch(url, { method: 'POST', body: form })
  assert.equal(res.status, 401)
  url = new URL(await sbx.downloadUrl('/home/user/dl.txt'))
  url.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
  res = await fetch(url)
  assert.equal(res.status, 401)
  // A URL signed for this sandbox, sent naming another one: refused.
  res = await fetch(await sbx.downloadUrl('/home/user/dl.txt'), { headers: { 'E2b-Sandbox-Id': other.sandboxId } })
  assert.equal(res.status, 401)
  // Naming its own sandbox is fine.
  res = await fetch(await sbx.downloadUrl('/home/user/dl.txt'), { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
  assert.equal(res.status, 200)
  // The other sandbox's URLs are its own.
  await other.files.write('/home/user/dl.txt', 'other bytes')
  res = await fetch(await other.downloadUrl('/home/user/dl.txt'))
  assert.equal(await res.text(), 'other bytes')
  ok('signed download and upload URLs; expired, tampered and misdirected signatures refused')

  // Removing what does not exist succeeds, as on E2B.
  await sbx.files.remove('/home/user/no/such/path')
  ok('remove of a missing path succeeds')

  // Listings are sorted by name, a directory's entries after it.
  await sbx.commands.run('mkdir -p /home/user/ls/b && cd /home/user/ls && touch c a b/z b/a B a.txt')
  let list = await sbx.files.list('/home/user/ls')
  assert.deepEqual(list.map((e) => e.name), ['B', 'a', 'a.txt', 'b', 'c'])
  list = await sbx.files.list('/home/user/ls', { depth: 2 })
  assert.deepEqual(list.map((e) => e.path.replace('/home/user/ls/', '')), ['B', 'a', 'a.txt', 'b', 'b/a', 'b/z', 'c'])
  ok('list sorted by name')

  // A symlink's target is absolute.
  await sbx.commands.run('cd /home/user/ls && ln -s a.txt rel && ln -s ../ls/b up && ln -s /etc/hostname abs')
  assert.equal((await sbx.files.getInfo('/home/user/ls/rel')).symlinkTarget, '/home/user/ls/a.txt')
  assert.equal((await sbx.files.getInfo('/home/user/ls/up')).symlinkTarget, '/home/user/ls/b')
  assert.equal((await sbx.files.getInfo('/home/user/ls/abs')).symlinkTarget, '/etc/hostname')
  ok('getInfo of a symlink reports the absolute target')

  // makeDir, rename and remove run as the user: what they make is the
  // user's, and root's files are out of their reach.
  assert.equal(await sbx.files.makeDir('/home/user/made/deep'), true)
  r = await sbx.commands.run('stat -c %U /home/user/made /home/user/made/deep')
  assert.equal(r.stdout, 'user\nuser\n')
  assert.equal((await sbx.files.getInfo('/home/user/made')).owner, 'user')
  assert.equal(await sbx.files.makeDir('/tmp/rootmade', { user: 'root' }), true)
  assert.equal((await sbx.files.getInfo('/tmp/rootmade')).owner, 'root')
  await assert.rejects(sbx.files.makeDir('/root/nope'))
  await sbx.files.write('/tmp/rootfile', 'x', { user: 'root' })
  await sbx.commands.run('chmod 1777 /tmp', { user: 'root' })
  await assert.rejects(sbx.files.rename('/tmp/rootfile', '/tmp/stolen'))
  await assert.rejects(sbx.files.remove('/tmp/rootfile'))
  assert.equal(await sbx.files.exists('/tmp/rootfile'), true)
  await sbx.files.rename('/tmp/rootfile', '/tmp/moved', { user: 'root' })
  await sbx.files.remove('/tmp/moved', { user: 'root' })
  assert.equal(await sbx.files.exists('/tmp/moved'), false)
  await sbx.files.rename('/home/user/made', '/home/user/made2')
  await sbx.files.remove('/home/user/made2')
  assert.equal(await sbx.files.exists('/home/user/made2'), false)
  ok('makeDir, rename and remove run as the user')

  // watchDir: inotify in the sandbox, recursive, every kind of event;
  // the file made in a new directory is seen created and written.
  await sbx.files.makeDir('/home/user/wd')
  await sbx.files.write('/home/user/wd/old.txt', 'o')
  const seen = []
  let wake = () => {}
  const want = ['create new', 'create new/f', 'write new/f', 'chmod old.txt', 'rename old.txt', 'create moved.txt', 'remove moved.txt']
  const has = () => want.every((w) => seen.includes(w))
  const h = await sbx.files.watchDir('/home/user/wd', (e) => { seen.push(`${e.type} ${e.name}`); if (has()) wake() }, { recursive: true })
  await sbx.commands.run('cd /home/user/wd && mkdir new && echo data > new/f && chmod 600 old.txt && mv old.txt moved.txt && rm moved.txt')
  await Promise.race([new Promise((res) => { wake = res; if (has()) res() }), new Promise((res) => setTimeout(res, 10_000))])
  await h.stop()
  assert.ok(has(), `watch events: ${JSON.stringify(seen)}`)
  // Not recursive: what happens below the directory is not reported.
  const flat = []
  const h2 = await sbx.files.watchDir('/home/user/wd', (e) => flat.push(`${e.type} ${e.name}`))
  await sbx.commands.run('cd /home/user/wd && echo x > new/g && echo y > top')
  const until = Date.now() + 10_000
  while (!flat.includes('create top') && Date.now() < until) await new Promise((res) => setTimeout(res, 50))
  await h2.stop()
  assert.ok(flat.includes('create top'), JSON.stringify(flat))
  assert.ok(!flat.some((x) => x.includes('new/g')), JSON.stringify(flat))
  ok('watchDir by inotify: create, write, chmod, rename, remove; recursive or not')
} finally {
  await sbx.kill()
  await other.kill()
}
console.log(`PASS ${mod}`)
