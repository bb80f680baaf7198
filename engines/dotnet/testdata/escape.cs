using System;
using System.Collections;
using System.Diagnostics;
using System.IO;
using System.Net.Sockets;
using System.Threading.Tasks;
using Virtufin.Worker;

// Escape tries, per event, one thing a worker must not be able to do, and
// answers what happened: "ok: ..." or "refused: <exception>".
public class Escape : IWorker
{
    [System.Runtime.InteropServices.DllImport("libc", SetLastError = true)]
    static extern int memfd_create(string name, uint flags);
    [System.Runtime.InteropServices.DllImport("libc", SetLastError = true)]
    static extern int shmget(int key, UIntPtr size, int flags);
    [System.Runtime.InteropServices.DllImport("libc", SetLastError = true)]
    static extern int socket(int domain, int type, int protocol);
    [System.Runtime.InteropServices.DllImport("libc")]
    static extern int close(int fd);

    // Native returns a refusal (an exception) when a libc call failed.
    static string Native(string what, int r)
    {
        if (r < 0)
            throw new InvalidOperationException(what + " failed, errno " + System.Runtime.InteropServices.Marshal.GetLastWin32Error());
        return what + " = " + r;
    }

    public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        var kind = input.Data.AsObject()["kind"].GetValue<string>();
        var arg = input.Data.AsObject()["arg"] == null ? "" : input.Data.AsObject()["arg"].ToString();
        string result;
        try
        {
            result = "ok: " + Attempt(kind, arg);
        }
        catch (Exception e)
        {
            var b = e.GetBaseException();
            result = "refused: " + b.GetType().Name + ": " + b.Message;
        }
        return Task.FromResult(new CloudEvent { Type = "escape.result", Data = result });
    }

    static string Attempt(string kind, string arg)
    {
        switch (kind)
        {
            case "env":
                var names = new System.Collections.Generic.List<string>();
                foreach (DictionaryEntry e in Environment.GetEnvironmentVariables())
                    names.Add(e.Key + "=" + e.Value);
                names.Sort();
                return string.Join(" ", names);
            case "exit":
                Environment.Exit(3);
                return "still here";
            case "exec":
                using (var p = Process.Start(new ProcessStartInfo("/bin/true") { UseShellExecute = false }))
                {
                    p.WaitForExit();
                    return "ran /bin/true, exit " + p.ExitCode;
                }
            case "tcp":
                using (var s = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp))
                {
                    s.Connect(new System.Net.IPEndPoint(System.Net.IPAddress.Loopback, int.Parse(arg)));
                    return "connected";
                }
            case "memfd":
                return Native("memfd_create", memfd_create("hog", 0));
            case "shm":
                return Native("shmget", shmget(0, (UIntPtr)(1 << 20), 0x380 /* IPC_CREAT|0600 */));
            case "netlink":
                return Native("socket(AF_NETLINK)", socket(16, 2 /* SOCK_DGRAM */, 0));
            case "vsock":
                return Native("socket(AF_VSOCK)", socket(40, 1 /* SOCK_STREAM */, 0));
            case "read-file":
                return File.ReadAllText(arg);
            case "write-outside":
                File.WriteAllText("/usr/escaped", "x");
                return "written";
            case "thread-exec":
                // A thread started by the worker is under the same filter.
                string r = null;
                var t = new System.Threading.Thread(() =>
                {
                    try { Process.Start("/bin/true").WaitForExit(); r = "ran"; }
                    catch (Exception e) { r = "refused: " + e.GetType().Name; }
                });
                t.Start();
                t.Join();
                return r;
            default:
                return "unknown kind " + kind;
        }
    }
}
