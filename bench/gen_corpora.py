#!/usr/bin/env python3
"""Writes labelled LogPai-style corpora under testdata/logs/: <name>.log (raw lines with headers)
and <name>.truth (the true template of each line, one per line).

The styles follow the public LogHub samples (HDFS, Spark, OpenSSH, Android, Windows CBS, Linux
syslog); contents and variables are generated, so the true template of every line is known.
Deterministic: `python3 bench/gen_corpora.py` always writes the same files.

    python3 bench/gen_corpora.py [--out testdata/logs] [--lines 2000]
"""
import argparse
import os
import random

MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
USERS = ["root", "admin", "test", "oracle", "guest", "postgres", "nagios", "ubuntu", "webmaster", "support", "git", "pi", "user"]
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
PKGS = ["com.android.phone", "com.tencent.mm", "android", "com.android.systemui", "com.google.android.gms", "com.whatsapp"]


def ip(r):
    return "%d.%d.%d.%d" % (r.randint(1, 223), r.randint(0, 255), r.randint(0, 255), r.randint(1, 254))


def blk(r):
    return "blk_%s%d" % (r.choice(["", "-"]), r.randint(10**17, 10**19))


def hexs(r, n=8):
    return "".join(r.choice("0123456789abcdef") for _ in range(n))


# Each style: header(r) -> str, and [(true template, component, level, make(r) -> content)].
def hdfs():
    def header(r, comp, level):
        return "0811%02d %02d%02d%02d %d %s %s:" % (r.randint(9, 11), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), r.randint(1, 40000), level, comp)
    path = lambda r: "/user/root/rand/_temporary/_task_200811092030_0001_m_%06d_0/part-%05d" % (r.randint(0, 999), r.randint(0, 999))
    t = [
        ("PacketResponder <*> for block <*> terminating", "dfs.DataNode$PacketResponder", "INFO", lambda r: "PacketResponder %d for block %s terminating" % (r.randint(0, 2), blk(r))),
        ("Received block <*> of size <*> from <*>", "dfs.DataNode$PacketResponder", "INFO", lambda r: "Received block %s of size %d from /%s" % (blk(r), r.randint(1, 67108864), ip(r))),
        ("Receiving block <*> src: <*> dest: <*>", "dfs.DataNode$DataXceiver", "INFO", lambda r: "Receiving block %s src: /%s:%d dest: /%s:50010" % (blk(r), ip(r), r.randint(1024, 65535), ip(r))),
        ("BLOCK* NameSystem.addStoredBlock: blockMap updated: <*> is added to <*> size <*>", "dfs.FSNamesystem", "INFO", lambda r: "BLOCK* NameSystem.addStoredBlock: blockMap updated: %s:50010 is added to %s size %d" % (ip(r), blk(r), r.randint(1, 67108864))),
        ("BLOCK* NameSystem.allocateBlock: <*> <*>", "dfs.FSNamesystem", "INFO", lambda r: "BLOCK* NameSystem.allocateBlock: %s. %s" % (path(r), blk(r))),
        ("Deleting block <*> file <*>", "dfs.FSDataset", "INFO", lambda r: "Deleting block %s file /mnt/hadoop/dfs/data/current/subdir%d/%s" % (blk(r), r.randint(0, 63), blk(r))),
        ("BLOCK* NameSystem.delete: <*> is added to invalidSet of <*>", "dfs.FSNamesystem", "INFO", lambda r: "BLOCK* NameSystem.delete: %s is added to invalidSet of %s:50010" % (blk(r), ip(r))),
        ("<*>:Transmitted block <*> to <*>", "dfs.DataNode$DataTransfer", "INFO", lambda r: "%s:50010:Transmitted block %s to /%s:50010" % (ip(r), blk(r), ip(r))),
        ("<*> Starting thread to transfer block <*> to <*>", "dfs.DataNode", "INFO", lambda r: "%s:50010 Starting thread to transfer block %s to %s:50010" % (ip(r), blk(r), ip(r))),
        ("Verification succeeded for <*>", "dfs.DataBlockScanner", "INFO", lambda r: "Verification succeeded for %s" % blk(r)),
        ("<*>:Served block <*> to <*>", "dfs.DataNode", "INFO", lambda r: "%s:50010:Served block %s to /%s" % (ip(r), blk(r), ip(r))),
        ("<*>:Got exception while serving <*> to <*>:", "dfs.DataNode", "WARN", lambda r: "%s:50010:Got exception while serving %s to /%s:" % (ip(r), blk(r), ip(r))),
        ("writeBlock <*> received exception java.io.IOException: Could not read from stream", "dfs.DataNode$DataXceiver", "INFO", lambda r: "writeBlock %s received exception java.io.IOException: Could not read from stream" % blk(r)),
        ("Exception in receiveBlock for block <*> java.io.EOFException", "dfs.DataNode$BlockReceiver", "INFO", lambda r: "Exception in receiveBlock for block %s java.io.EOFException" % blk(r)),
        ("PacketResponder <*> for block <*> Interrupted.", "dfs.DataNode$PacketResponder", "INFO", lambda r: "PacketResponder %d for block %s Interrupted." % (r.randint(0, 2), blk(r))),
        ("Unexpected error trying to delete block <*>. BlockInfo not found in volumeMap.", "dfs.FSDataset", "WARN", lambda r: "Unexpected error trying to delete block %s. BlockInfo not found in volumeMap." % blk(r)),
        ("BLOCK* ask <*> to delete <*>", "dfs.FSNamesystem", "INFO", lambda r: "BLOCK* ask %s:50010 to delete %s" % (ip(r), " ".join(blk(r) for _ in range(1)))),
        ("BLOCK* NameSystem.addStoredBlock: Redundant addStoredBlock request received for <*> on <*> size <*>", "dfs.FSNamesystem", "INFO", lambda r: "BLOCK* NameSystem.addStoredBlock: Redundant addStoredBlock request received for %s on %s:50010 size %d" % (blk(r), ip(r), r.randint(1, 9999999))),
    ]
    return header, t


def spark():
    def header(r, comp, level):
        return "17/06/%02d %02d:%02d:%02d %s %s:" % (r.randint(1, 30), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), level, comp)
    user = lambda r: r.choice(["yarn", "curi", "root", "hadoop", "spark"])
    t = [
        ("Registered signal handlers for [TERM, HUP, INT]", "executor.CoarseGrainedExecutorBackend", "INFO", lambda r: "Registered signal handlers for [TERM, HUP, INT]"),
        ("Changing view acls to: <*>", "spark.SecurityManager", "INFO", lambda r: "Changing view acls to: %s" % user(r)),
        ("Changing modify acls to: <*>", "spark.SecurityManager", "INFO", lambda r: "Changing modify acls to: %s" % user(r)),
        ("SecurityManager: authentication disabled; ui acls disabled; users with view permissions: Set(<*>); users with modify permissions: Set(<*>)", "spark.SecurityManager", "INFO", lambda r: "SecurityManager: authentication disabled; ui acls disabled; users with view permissions: Set(%s); users with modify permissions: Set(%s)" % (user(r), user(r))),
        ("Slf4jLogger started", "slf4j.Slf4jLogger", "INFO", lambda r: "Slf4jLogger started"),
        ("Starting remoting", "Remoting", "INFO", lambda r: "Starting remoting"),
        ("Remoting started; listening on addresses :[<*>]", "Remoting", "INFO", lambda r: "Remoting started; listening on addresses :[akka.tcp://sparkExecutorActorSystem@mesos-slave-%02d:%d]" % (r.randint(1, 40), r.randint(30000, 60000))),
        ("Successfully started service <*> on port <*>.", "util.Utils", "INFO", lambda r: "Successfully started service '%s' on port %d." % (r.choice(["sparkExecutorActorSystem", "org.apache.spark.network.netty.NettyBlockTransferService"]), r.randint(30000, 60000))),
        ("Created local directory at <*>", "storage.DiskBlockManager", "INFO", lambda r: "Created local directory at /opt/hdfs/nodemanager/usercache/curi/appcache/application_1485248649253_%04d/blockmgr-%s-%s" % (r.randint(1, 200), hexs(r), hexs(r, 4))),
        ("MemoryStore started with capacity <*> GB", "storage.MemoryStore", "INFO", lambda r: "MemoryStore started with capacity %.1f GB" % r.uniform(1, 30)),
        ("Found block <*> locally", "storage.BlockManager", "INFO", lambda r: "Found block rdd_%d_%d locally" % (r.randint(0, 99), r.randint(0, 99))),
        ("Started reading broadcast variable <*>", "broadcast.TorrentBroadcast", "INFO", lambda r: "Started reading broadcast variable %d" % r.randint(0, 999)),
        ("Block <*> stored as bytes in memory (estimated size <*> KB, free <*> <*>)", "storage.MemoryStore", "INFO", lambda r: "Block broadcast_%d_piece0 stored as bytes in memory (estimated size %.1f KB, free %.1f %s)" % (r.randint(0, 99), r.uniform(1, 99), r.uniform(1, 999), r.choice(["KB", "MB", "GB"]))),
        ("Reading broadcast variable <*> took <*> ms", "broadcast.TorrentBroadcast", "INFO", lambda r: "Reading broadcast variable %d took %d ms" % (r.randint(0, 999), r.randint(1, 999))),
        ("Running task <*> in stage <*> (TID <*>)", "executor.Executor", "INFO", lambda r: "Running task %d.0 in stage %d.0 (TID %d)" % (r.randint(0, 99), r.randint(0, 99), r.randint(0, 9999))),
        ("Finished task <*> in stage <*> (TID <*>). <*> bytes result sent to driver", "executor.Executor", "INFO", lambda r: "Finished task %d.0 in stage %d.0 (TID %d). %d bytes result sent to driver" % (r.randint(0, 99), r.randint(0, 99), r.randint(0, 9999), r.randint(100, 9999))),
        ("Got assigned task <*>", "executor.CoarseGrainedExecutorBackend", "INFO", lambda r: "Got assigned task %d" % r.randint(0, 9999)),
        ("Partition <*> not found, computing it", "spark.CacheManager", "INFO", lambda r: "Partition rdd_%d_%d not found, computing it" % (r.randint(0, 99), r.randint(0, 99))),
        ("Updating epoch to <*> and clearing cache", "spark.MapOutputTrackerWorker", "INFO", lambda r: "Updating epoch to %d and clearing cache" % r.randint(0, 99)),
        ("Trying to register BlockManager", "storage.BlockManagerMaster", "INFO", lambda r: "Trying to register BlockManager"),
        ("Registered BlockManager", "storage.BlockManagerMaster", "INFO", lambda r: "Registered BlockManager"),
        ("Executor is trying to kill task <*> in stage <*> (TID <*>)", "executor.Executor", "INFO", lambda r: "Executor is trying to kill task %d.0 in stage %d.0 (TID %d)" % (r.randint(0, 99), r.randint(0, 99), r.randint(0, 9999))),
        ("Getting <*> non-empty blocks out of <*> blocks", "storage.ShuffleBlockFetcherIterator", "INFO", lambda r: "Getting %d non-empty blocks out of %d blocks" % (r.randint(0, 99), r.randint(0, 99))),
        ("Started <*> remote fetches in <*> ms", "storage.ShuffleBlockFetcherIterator", "INFO", lambda r: "Started %d remote fetches in %d ms" % (r.randint(0, 99), r.randint(0, 99))),
        ("Driver commanded a shutdown", "executor.CoarseGrainedExecutorBackend", "INFO", lambda r: "Driver commanded a shutdown"),
        ("Error sending result <*> to <*>; closing connection", "server.TransportRequestHandler", "ERROR", lambda r: "Error sending result ChunkFetchSuccess{streamChunkId=StreamChunkId{streamId=%d, chunkIndex=0}} to /%s:%d; closing connection" % (r.randint(10**9, 10**10), ip(r), r.randint(1024, 65535))),
    ]
    return header, t


def openssh():
    def header(r, comp, level):
        return "%s %2d %02d:%02d:%02d LabSZ sshd[%d]:" % (r.choice(MONTHS), r.randint(1, 28), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), r.randint(1000, 30000))
    t = [
        ("reverse mapping checking getaddrinfo for <*> [<*>] failed - POSSIBLE BREAK-IN ATTEMPT!", "", "", lambda r: "reverse mapping checking getaddrinfo for %s.static.example.net [%s] failed - POSSIBLE BREAK-IN ATTEMPT!" % (ip(r).replace(".", "-"), ip(r))),
        ("Invalid user <*> from <*>", "", "", lambda r: "Invalid user %s from %s" % (r.choice(USERS), ip(r))),
        ("input_userauth_request: invalid user <*> [preauth]", "", "", lambda r: "input_userauth_request: invalid user %s [preauth]" % r.choice(USERS)),
        ("pam_unix(sshd:auth): check pass; user unknown", "", "", lambda r: "pam_unix(sshd:auth): check pass; user unknown"),
        ("pam_unix(sshd:auth): authentication failure; logname= uid=<*> euid=<*> tty=ssh ruser= rhost=<*>", "", "", lambda r: "pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost=%s" % ip(r)),
        ("pam_unix(sshd:auth): authentication failure; logname= uid=<*> euid=<*> tty=ssh ruser= rhost=<*> user=<*>", "", "", lambda r: "pam_unix(sshd:auth): authentication failure; logname= uid=0 euid=0 tty=ssh ruser= rhost=%s  user=%s" % (ip(r), r.choice(USERS))),
        ("Failed password for invalid user <*> from <*> port <*> ssh2", "", "", lambda r: "Failed password for invalid user %s from %s port %d ssh2" % (r.choice(USERS), ip(r), r.randint(1024, 65535))),
        ("Failed password for <*> from <*> port <*> ssh2", "", "", lambda r: "Failed password for %s from %s port %d ssh2" % (r.choice(USERS), ip(r), r.randint(1024, 65535))),
        ("Received disconnect from <*>: <*>: Bye Bye [preauth]", "", "", lambda r: "Received disconnect from %s: 11: Bye Bye [preauth]" % ip(r)),
        ("Connection closed by <*> [preauth]", "", "", lambda r: "Connection closed by %s [preauth]" % ip(r)),
        ("PAM <*> more authentication failures; logname= uid=<*> euid=<*> tty=ssh ruser= rhost=<*> user=<*>", "", "", lambda r: "PAM %d more authentication failures; logname= uid=0 euid=0 tty=ssh ruser= rhost=%s  user=%s" % (r.randint(1, 5), ip(r), r.choice(USERS))),
        ("Accepted password for <*> from <*> port <*> ssh2", "", "", lambda r: "Accepted password for %s from %s port %d ssh2" % (r.choice(USERS), ip(r), r.randint(1024, 65535))),
        ("pam_unix(sshd:session): session opened for user <*> by (uid=<*>)", "", "", lambda r: "pam_unix(sshd:session): session opened for user %s by (uid=0)" % r.choice(USERS)),
        ("pam_unix(sshd:session): session closed for user <*>", "", "", lambda r: "pam_unix(sshd:session): session closed for user %s" % r.choice(USERS)),
        ("Disconnecting: Too many authentication failures for <*> [preauth]", "", "", lambda r: "Disconnecting: Too many authentication failures for %s [preauth]" % r.choice(USERS)),
        ("error: Received disconnect from <*>: <*>: com.jcraft.jsch.JSchException: Auth fail [preauth]", "", "", lambda r: "error: Received disconnect from %s: 3: com.jcraft.jsch.JSchException: Auth fail [preauth]" % ip(r)),
        ("Did not receive identification string from <*>", "", "", lambda r: "Did not receive identification string from %s" % ip(r)),
        ("message repeated <*> times: [ Failed password for <*> from <*> port <*> ssh2]", "", "", lambda r: "message repeated %d times: [ Failed password for %s from %s port %d ssh2]" % (r.randint(2, 5), r.choice(USERS), ip(r), r.randint(1024, 65535))),
        ("fatal: Read from socket failed: Connection reset by peer [preauth]", "", "", lambda r: "fatal: Read from socket failed: Connection reset by peer [preauth]"),
        ("Received disconnect from <*>: <*>: Closed due to user request. [preauth]", "", "", lambda r: "Received disconnect from %s: 11: Closed due to user request. [preauth]" % ip(r)),
    ]
    return header, t


def android():
    def header(r, comp, level):
        pid = r.randint(600, 30000)
        return "03-%02d %02d:%02d:%02d.%03d  %d  %d %s %s:" % (r.randint(1, 31), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), r.randint(0, 999), pid, pid + r.randint(0, 2000), level, comp)
    t = [
        ("Skipping <*> frames! The application may be doing too much work on its main thread.", "Choreographer", "I", lambda r: "Skipping %d frames!  The application may be doing too much work on its main thread." % r.randint(30, 300)),
        ("acquire lock=<*>, flags=<*>, tag=<*>, name=<*>, ws=null, uid=<*>, pid=<*>", "PowerManagerService", "D", lambda r: "acquire lock=%d, flags=0x%x, tag=\"%s\", name=%s, ws=null, uid=%d, pid=%d" % (r.randint(10**8, 10**9), r.randint(1, 64), r.choice(["RILJ", "WifiStateMachine", "*alarm*", "View Lock"]), r.choice(PKGS), r.randint(1000, 20000), r.randint(600, 30000))),
        ("release:lock=<*>, flg=<*>, tag=<*>, name=<*>, ws=null, uid=<*>, pid=<*>", "PowerManagerService", "D", lambda r: "release:lock=%d, flg=0x%x, tag=\"%s\", name=%s, ws=null, uid=%d, pid=%d" % (r.randint(10**8, 10**9), r.randint(0, 64), r.choice(["RILJ", "WifiStateMachine", "*alarm*", "View Lock"]), r.choice(PKGS), r.randint(1000, 20000), r.randint(600, 30000))),
        ("Start proc <*> for service <*>", "ActivityManager", "I", lambda r: "Start proc %d:%s/u0a%d for service %s/.%s" % (r.randint(600, 30000), r.choice(PKGS), r.randint(10, 200), r.choice(PKGS), r.choice(["SyncService", "PushService", "SystemUIService"]))),
        ("Process <*> (pid <*>) has died", "ActivityManager", "I", lambda r: "Process %s (pid %d) has died" % (r.choice(PKGS), r.randint(600, 30000))),
        ("Animating brightness: target=<*>, rate=<*>", "DisplayPowerController", "D", lambda r: "Animating brightness: target=%d, rate=%.1f" % (r.randint(0, 255), r.uniform(0, 200))),
        ("setSystemUiVisibility vis=<*> mask=<*> oldVal=<*> newVal=<*> diff=<*>", "PhoneStatusBar", "D", lambda r: "setSystemUiVisibility vis=%x mask=%x oldVal=%x newVal=%x diff=%x" % tuple(r.randint(1, 0xfffff) for _ in range(5))),
        ("handleBatteryUpdate", "KeyguardUpdateMonitor", "D", lambda r: "handleBatteryUpdate"),
        ("unregisterListener:: Listener= <*>", "SensorManager", "D", lambda r: "unregisterListener:: Listener= android.view.OrientationEventListener$SensorEventListenerImpl@%s" % hexs(r, 7)),
        ("getStreamVolume streamType: <*> volume: <*>", "AudioManager", "D", lambda r: "getStreamVolume streamType: %d volume: %d" % (r.randint(0, 9), r.randint(0, 15))),
        ("Killing <*> (adj <*>): empty #<*>", "ActivityManager", "I", lambda r: "Killing %d:%s/u0a%d (adj %d): empty #%d" % (r.randint(600, 30000), r.choice(PKGS), r.randint(10, 200), r.randint(900, 906), r.randint(17, 40))),
        ("Reconfiguring input devices. changes=<*>", "InputReader", "I", lambda r: "Reconfiguring input devices.  changes=0x%08x" % r.randint(1, 64)),
        ("START u0 {act=android.intent.action.MAIN cat=[android.intent.category.HOME] flg=<*> cmp=<*>} from uid <*>", "ActivityManager", "I", lambda r: "START u0 {act=android.intent.action.MAIN cat=[android.intent.category.HOME] flg=0x%x cmp=%s/.Launcher} from uid %d" % (r.randint(1, 0xfffffff), r.choice(PKGS), r.randint(1000, 20000))),
        ("level:<*>, scale:<*>, status:<*>, health:<*>, present:true, voltage: <*>, temperature: <*>", "BatteryService", "D", lambda r: "level:%d, scale:100, status:%d, health:2, present:true, voltage: %d, temperature: %d" % (r.randint(0, 100), r.randint(1, 5), r.randint(3500, 4400), r.randint(200, 450))),
        ("updateWakeLockSummaryLocked: mWakefulness=Awake, mWakeLockSummary=<*>", "PowerManagerService", "D", lambda r: "updateWakeLockSummaryLocked: mWakefulness=Awake, mWakeLockSummary=0x%x" % r.randint(1, 64)),
        ("Screen frozen for <*> due to Window{<*> u0 <*>}", "WindowManager", "I", lambda r: "Screen frozen for +%dms due to Window{%s u0 %s}" % (r.randint(100, 999), hexs(r, 7), r.choice(PKGS))),
        ("notifyScreenOff", "DisplayManager", "D", lambda r: "notifyScreenOff"),
        ("Failed to read value from <*>", "HwBattery", "E", lambda r: "Failed to read value from /sys/class/power_supply/battery/%s" % r.choice(["capacity", "current_now", "temp"])),
    ]
    return header, t


def windows():
    def header(r, comp, level):
        return "2016-09-%02d %02d:%02d:%02d, %-21s %-6s" % (r.randint(1, 30), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), level, comp)
    t = [
        ("Loaded Servicing Stack <*> with Core: <*>", "CBS", "Info", lambda r: "Loaded Servicing Stack v6.1.7601.%d with Core: C:\\Windows\\winsxs\\amd64_microsoft-windows-servicingstack_31bf3856ad364e35_6.1.7601.%d_none_%s\\cbscore.dll" % (r.randint(17000, 24000), r.randint(17000, 24000), hexs(r, 16))),
        ("Starting TrustedInstaller initialization.", "CBS", "Info", lambda r: "Starting TrustedInstaller initialization."),
        ("Ending TrustedInstaller initialization.", "CBS", "Info", lambda r: "Ending TrustedInstaller initialization."),
        ("Starting the TrustedInstaller main loop.", "CBS", "Info", lambda r: "Starting the TrustedInstaller main loop."),
        ("TrustedInstaller service starts successfully.", "CBS", "Info", lambda r: "TrustedInstaller service starts successfully."),
        ("No startup processing required, TrustedInstaller service was not set as autostart", "CBS", "Info", lambda r: "No startup processing required, TrustedInstaller service was not set as autostart"),
        ("Startup processing thread terminated normally", "CBS", "Info", lambda r: "Startup processing thread terminated normally"),
        ("Session: <*> initialized by client <*>.", "CBS", "Info", lambda r: "Session: %d_%d initialized by client %s." % (r.randint(10**7, 10**8), r.randint(10**9, 4 * 10**9), r.choice(["WindowsUpdateAgent", "DiagnosticRepair", "TrustedInstaller"]))),
        ("Read out cached package applicability for package: <*>, ApplicableState: <*>, CurrentState:<*>", "CBS", "Info", lambda r: "Read out cached package applicability for package: Package_for_KB%d~31bf3856ad364e35~amd64~~6.1.1.%d, ApplicableState: %d, CurrentState:%d" % (r.randint(10**6, 4 * 10**6), r.randint(0, 9), r.choice([80, 112]), r.choice([0, 112]))),
        ("Warning: Unrecognized packageExtended attribute.", "CBS", "Info", lambda r: "Warning: Unrecognized packageExtended attribute."),
        ("Expecting attribute name [HRESULT = <*> - CBS_E_MANIFEST_INVALID_ITEM]", "CBS", "Info", lambda r: "Expecting attribute name [HRESULT = 0x800f080d - CBS_E_MANIFEST_INVALID_ITEM]"),
        ("Failed to get next element [HRESULT = <*> - CBS_E_MANIFEST_INVALID_ITEM]", "CBS", "Info", lambda r: "Failed to get next element [HRESULT = 0x800f080d - CBS_E_MANIFEST_INVALID_ITEM]"),
        ("SQM: Initializing online with Windows opt-in: False", "CBS", "Info", lambda r: "SQM: Initializing online with Windows opt-in: False"),
        ("SQM: Cleaning up report files older than <*> days.", "CBS", "Info", lambda r: "SQM: Cleaning up report files older than %d days." % r.randint(1, 30)),
        ("SQM: Requesting upload of all unsent reports.", "CBS", "Info", lambda r: "SQM: Requesting upload of all unsent reports."),
        ("SQM: Failed to start upload with file pattern: <*>, flags: <*> [HRESULT = <*> - E_FAIL]", "CBS", "Info", lambda r: "SQM: Failed to start upload with file pattern: C:\\Windows\\servicing\\sqm\\*_std.sqm, flags: 0x%x [HRESULT = 0x80004005 - E_FAIL]" % r.randint(1, 8)),
        ("Idle processing thread terminated normally", "CBS", "Info", lambda r: "Idle processing thread terminated normally"),
        ("<*> [SR] Verify complete", "CSI", "Info", lambda r: "%08x [SR] Verify complete" % r.randint(1, 2**31)),
        ("<*> [SR] Verifying <*> (<*>) components", "CSI", "Info", lambda r: "%08x [SR] Verifying 100 (0x%016x) components" % (r.randint(1, 2**31), r.randint(1, 2**40))),
        ("<*> [SR] Beginning Verify and Repair transaction", "CSI", "Info", lambda r: "%08x [SR] Beginning Verify and Repair transaction" % r.randint(1, 2**31)),
        ("<*> [SR] Cannot repair member file <*> of <*>, Version = <*>", "CSI", "Info", lambda r: "%08x [SR] Cannot repair member file [l:%d]'%s' of %s, Version = 6.1.7601.%d" % (r.randint(1, 2**31), r.randint(10, 40), r.choice(["wow64.dll", "ntdll.dll"]), r.choice(["Microsoft-Windows-Wow64", "Microsoft-Windows-Kernel"]), r.randint(17000, 24000))),
    ]
    return header, t


def syslog():
    def header(r, comp, level):
        return "%s %2d %02d:%02d:%02d combo %s" % (r.choice(MONTHS), r.randint(1, 28), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), comp % r.randint(1000, 30000) if "%d" in comp else comp)
    t = [
        ("authentication failure; logname= uid=<*> euid=<*> tty=NODEVssh ruser= rhost=<*>", "sshd(pam_unix)[%d]:", "", lambda r: "authentication failure; logname= uid=0 euid=0 tty=NODEVssh ruser= rhost=%s" % ip(r)),
        ("authentication failure; logname= uid=<*> euid=<*> tty=NODEVssh ruser= rhost=<*> user=<*>", "sshd(pam_unix)[%d]:", "", lambda r: "authentication failure; logname= uid=0 euid=0 tty=NODEVssh ruser= rhost=%s  user=%s" % (ip(r), r.choice(USERS))),
        ("check pass; user unknown", "sshd(pam_unix)[%d]:", "", lambda r: "check pass; user unknown"),
        ("session opened for user <*> by (uid=<*>)", "su(pam_unix)[%d]:", "", lambda r: "session opened for user %s by (uid=%d)" % (r.choice(["cyrus", "news", "root"]), r.choice([0, 500]))),
        ("session closed for user <*>", "su(pam_unix)[%d]:", "", lambda r: "session closed for user %s" % r.choice(["cyrus", "news", "root"])),
        ("ALERT exited abnormally with [<*>]", "logrotate:", "", lambda r: "ALERT exited abnormally with [1]"),
        ("connection from <*> (<*>) at <*>", "ftpd[%d]:", "", lambda r: "connection from %s (%s) at %s %s %2d %02d:%02d:%02d 2005" % (ip(r), r.choice(["", "host.example.org", "dsl.provider.net"]), r.choice(DAYS), r.choice(MONTHS), r.randint(1, 28), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59))),
        ("restart.", "syslogd 1.4.1:", "", lambda r: "restart."),
        ("START: <*> pid=<*> from=<*>", "xinetd[%d]:", "", lambda r: "START: %s pid=%d from=%s" % (r.choice(["telnet", "ftp", "rsync"]), r.randint(1000, 30000), ip(r))),
        ("cupsd shutdown succeeded", "cups:", "", lambda r: "cupsd shutdown succeeded"),
        ("cupsd startup succeeded", "cups:", "", lambda r: "cupsd startup succeeded"),
        ("audit(<*>): initialized", "kernel:", "", lambda r: "audit(%d.%d:0): initialized" % (r.randint(10**9, 2 * 10**9), r.randint(0, 10**9))),
        ("Received SNMP packet(s) from <*>", "snmpd[%d]:", "", lambda r: "Received SNMP packet(s) from %s" % ip(r)),
        ("HCI daemon ver <*> started", "hcid[%d]:", "", lambda r: "HCI daemon ver 2.4 started"),
        ("hcid startup succeeded", "bluetooth:", "", lambda r: "hcid startup succeeded"),
        ("Version <*> Starting", "rpc.statd[%d]:", "", lambda r: "Version 1.0.6 Starting"),
        ("Kerberos authentication failed", "sshd(pam_unix)[%d]:", "", lambda r: "Kerberos authentication failed"),
        ("Memory: <*> available (<*> kernel code, <*> reserved, <*> data, <*> init, <*> highmem)", "kernel:", "", lambda r: "Memory: %dk/%dk available (%dk kernel code, %dk reserved, %dk data, %dk init, 0k highmem)" % tuple(r.randint(100, 300000) for _ in range(6))),
        ("Out of Memory: Killed process <*> (<*>).", "kernel:", "", lambda r: "Out of Memory: Killed process %d (%s)." % (r.randint(1000, 30000), r.choice(["httpd", "java", "mysqld"]))),
    ]
    return header, t


STYLES = {"hdfs": hdfs, "spark": spark, "openssh": openssh, "android": android, "windows": windows, "syslog": syslog}


# Held-out styles: written after the miner was tuned and never used to tune it; their figures
# are reported separately (testdata/logs/heldout/).
def apache():
    def header(r, comp, level):
        return "[%s %s %02d %02d:%02d:%02d 2005] [%s]" % (r.choice(DAYS), r.choice(MONTHS), r.randint(1, 28), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), level)
    t = [
        ("workerEnv.init() ok <*>", "", "notice", lambda r: "workerEnv.init() ok /etc/httpd/conf/workers2.properties"),
        ("mod_jk child workerEnv in error state <*>", "", "error", lambda r: "mod_jk child workerEnv in error state %d" % r.randint(1, 10)),
        ("jk2_init() Found child <*> in scoreboard slot <*>", "", "notice", lambda r: "jk2_init() Found child %d in scoreboard slot %d" % (r.randint(1000, 30000), r.randint(1, 12))),
        ("[client <*>] Directory index forbidden by rule: <*>", "", "error", lambda r: "[client %s] Directory index forbidden by rule: /var/www/html/" % ip(r)),
        ("jk2_init() Can't find child <*> in scoreboard", "", "error", lambda r: "jk2_init() Can't find child %d in scoreboard" % r.randint(1000, 30000)),
        ("mod_jk child init <*> <*>", "", "error", lambda r: "mod_jk child init 1 -2"),
        ("[client <*>] File does not exist: <*>", "", "error", lambda r: "[client %s] File does not exist: /var/www/html/%s" % (ip(r), r.choice(["robots.txt", "favicon.ico", "scripts/x.php"]))),
        ("Apache/<*> (Fedora) configured -- resuming normal operations", "", "notice", lambda r: "Apache/2.0.49 (Fedora) configured -- resuming normal operations"),
        ("Digest: generating secret for digest authentication ...", "", "notice", lambda r: "Digest: generating secret for digest authentication ..."),
        ("Digest: done", "", "notice", lambda r: "Digest: done"),
        ("caught SIGTERM, shutting down", "", "notice", lambda r: "caught SIGTERM, shutting down"),
        ("suEXEC mechanism enabled (wrapper: <*>)", "", "notice", lambda r: "suEXEC mechanism enabled (wrapper: /usr/sbin/suexec)"),
        ("[client <*>] script not found or unable to stat: <*>", "", "error", lambda r: "[client %s] script not found or unable to stat: /var/www/cgi-bin/%s" % (ip(r), r.choice(["awstats", "formmail", "test.cgi"]))),
    ]
    return header, t


def zookeeper():
    def header(r, comp, level):
        return "2015-07-%02d %02d:%02d:%02d,%03d - %-5s [%s] -" % (r.randint(1, 31), r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), r.randint(0, 999), level, comp % r.randint(1, 3) if "%d" in comp else comp)
    nio = "NIOServerCxn.Factory:0.0.0.0/0.0.0.0:2181:%s"
    t = [
        ("Notification time out: <*>", "QuorumPeer[myid=%d]/0:0:0:0:0:0:0:0:2181:FastLeaderElection@774", "INFO", lambda r: "Notification time out: %d" % r.choice([200, 400, 800, 1600, 3200, 6400])),
        ("Received connection request <*>", "/10.10.34.11:3888:QuorumCnxManager$Listener@493", "INFO", lambda r: "Received connection request /%s:%d" % (ip(r), r.randint(1024, 65535))),
        ("Interrupting SendWorker", "RecvWorker:188978561024:QuorumCnxManager$RecvWorker@765", "WARN", lambda r: "Interrupting SendWorker"),
        ("Send worker leaving thread", "SendWorker:188978561024:QuorumCnxManager$SendWorker@679", "WARN", lambda r: "Send worker leaving thread"),
        ("Accepted socket connection from <*>", nio % "NIOServerCnxnFactory@197", "INFO", lambda r: "Accepted socket connection from /%s:%d" % (ip(r), r.randint(1024, 65535))),
        ("Client attempting to establish new session at <*>", nio % "ZooKeeperServer@839", "INFO", lambda r: "Client attempting to establish new session at /%s:%d" % (ip(r), r.randint(1024, 65535))),
        ("Established session <*> with negotiated timeout <*> for client <*>", "CommitProcessor:1:ZooKeeperServer@595", "INFO", lambda r: "Established session 0x%x with negotiated timeout %d for client /%s:%d" % (r.randint(2**40, 2**50), r.choice([10000, 20000]), ip(r), r.randint(1024, 65535))),
        ("Closed socket connection for client <*> which had sessionid <*>", nio % "NIOServerCnxn@1001", "INFO", lambda r: "Closed socket connection for client /%s:%d which had sessionid 0x%x" % (ip(r), r.randint(1024, 65535), r.randint(2**40, 2**50))),
        ("caught end of stream exception", nio % "NIOServerCnxn@357", "WARN", lambda r: "caught end of stream exception"),
        ("Unexpected exception causing shutdown while sock still open", "LearnerHandler-/10.10.34.12:35276:LearnerHandler@562", "ERROR", lambda r: "Unexpected exception causing shutdown while sock still open"),
        ("LOOKING", "QuorumPeer[myid=%d]/0:0:0:0:0:0:0:0:2181:QuorumPeer@670", "INFO", lambda r: "LOOKING"),
        ("FOLLOWING", "QuorumPeer[myid=%d]/0:0:0:0:0:0:0:0:2181:QuorumPeer@738", "INFO", lambda r: "FOLLOWING"),
        ("LEADING", "QuorumPeer[myid=%d]/0:0:0:0:0:0:0:0:2181:QuorumPeer@750", "INFO", lambda r: "LEADING"),
        ("Expiring session <*>, timeout of <*> exceeded", "SessionTracker:ZooKeeperServer@325", "INFO", lambda r: "Expiring session 0x%x, timeout of %dms exceeded" % (r.randint(2**40, 2**50), r.choice([10000, 20000]))),
        ("Processed session termination for sessionid: <*>", "ProcessThread(sid:1 cport:-1)::PrepRequestProcessor@476", "INFO", lambda r: "Processed session termination for sessionid: 0x%x" % r.randint(2**40, 2**50)),
        ("Cannot open channel to <*> at election address <*>", "WorkerSender[myid=1]:QuorumCnxManager@368", "WARN", lambda r: "Cannot open channel to %d at election address /%s:3888" % (r.randint(1, 3), ip(r))),
    ]
    return header, t


HELDOUT = {"apache": apache, "zookeeper": zookeeper}


def generate(name, n, seed):
    r = random.Random("%s-%d" % (name, seed))
    header, templates = {**STYLES, **HELDOUT}[name]()
    # Zipf-like frequencies over a shuffled order, so some templates are rare.
    order = list(range(len(templates)))
    r.shuffle(order)
    weights = [0.0] * len(templates)
    for rank, i in enumerate(order):
        weights[i] = 1.0 / (rank + 1) ** 1.1
    lines, truth = [], []
    for _ in range(n):
        i = r.choices(range(len(templates)), weights)[0]
        true_t, comp, level, make = templates[i]
        lines.append("%s %s" % (header(r, comp, level), make(r)))
        truth.append(true_t)
    return lines, truth


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata/logs")
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in STYLES:
        lines, truth = generate(name, a.lines, a.seed)
        with open(os.path.join(a.out, name + ".log"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(a.out, name + ".truth"), "w") as f:
            f.write("\n".join(truth) + "\n")
        print("%s: %d lines, %d templates" % (name, len(lines), len(set(truth))))
    held = os.path.join(a.out, "heldout")
    os.makedirs(held, exist_ok=True)
    for name in HELDOUT:
        lines, truth = generate(name, a.lines, a.seed)
        with open(os.path.join(held, name + ".log"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(held, name + ".truth"), "w") as f:
            f.write("\n".join(truth) + "\n")
        print("heldout/%s: %d lines, %d templates" % (name, len(lines), len(set(truth))))


if __name__ == "__main__":
    main()
