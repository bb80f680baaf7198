// wmcsc: a spare C# compiler (engines/dotnet/sparecompiler.go). It loads
// mcs.exe, compiles the warm-up source it is given (the node's, not a
// worker's) so that the compiler's code is loaded and compiled, deletes
// what that wrote, says it is ready and waits. The node then writes one
// worker's source into its slot and sends a nonce and the compiler's
// arguments, one per line, ending with an empty line; it compiles them
// exactly as mcs would (the same messages on stdout), says it is done
// (naming the nonce) when the compile succeeded, and exits: 0 when it
// succeeded, 1 when it did not. One worker's compile per process, never
// more.
using System;
using System.Collections.Generic;
using System.IO;
using System.Reflection;

static class SpareCompiler
{
    const string Ready = "\u0001wmcsc ready";

    // args: mcs.exe, the warm-up output, then the warm-up compile's arguments.
    static int Main(string[] args)
    {
        if (args.Length < 3) {
            Console.Error.WriteLine("usage: wmcsc.exe <mcs.exe> <warm-up output> <mcs arguments...>");
            return 2;
        }
        var mcs = Assembly.LoadFrom(args[0]);
        var warmOut = args[1];
        var warm = new string[args.Length - 2];
        Array.Copy(args, 2, warm, 0, warm.Length);
        var quiet = new StringWriter();
        // The entry point mcs has for compiling in process: it resets the
        // compiler's static state (its table of source files) after.
        var entry = mcs.GetType("Mono.CSharp.CompilerCallableEntryPoint", true);
        var ok = (bool)entry.GetMethod("InvokeCompiler", new Type[] { typeof(string[]), typeof(TextWriter) }).Invoke(null, new object[] { warm, quiet });
        entry.GetMethod("Reset", new Type[] { typeof(bool) }).Invoke(null, new object[] { true });
        try { File.Delete(warmOut); } catch (Exception) { }
        if (!ok) {
            Console.Error.WriteLine("the warm-up compile failed: " + quiet);
            return 2;
        }
        Console.Out.WriteLine(Ready);
        Console.Out.Flush();
        // The node's nonce, then the arguments, then an empty line.
        var nonce = Console.In.ReadLine();
        var real = new List<string>();
        string line;
        while ((line = Console.In.ReadLine()) != null && line.Length > 0)
            real.Add(line);
        if (nonce == null || line == null)
            return 2; // the node went away before sending a compile
        ok = Compile(mcs, real.ToArray(), Console.Out);
        if (ok) {
            // The assembly is written and closed: the node need not wait
            // for the runtime's shutdown. Only the node knows the nonce,
            // so nothing in a compiler message can say this.
            Console.Out.WriteLine("\u0001wmcsc done " + nonce);
        }
        Console.Out.Flush();
        return ok ? 0 : 1;
    }

    // Compile is mcs's Driver.Main without its Environment.Exit.
    static bool Compile(Assembly mcs, string[] args, TextWriter output)
    {
        var parserType = mcs.GetType("Mono.CSharp.CommandLineParser", true);
        var parser = Activator.CreateInstance(parserType, new object[] { output });
        var settings = parserType.GetMethod("ParseArguments", new Type[] { typeof(string[]) }).Invoke(parser, new object[] { args });
        if (settings == null)
            return false;
        var printer = Activator.CreateInstance(mcs.GetType("Mono.CSharp.StreamReportPrinter", true), new object[] { output });
        var ctx = Activator.CreateInstance(mcs.GetType("Mono.CSharp.CompilerContext", true), new object[] { settings, printer });
        var driverType = mcs.GetType("Mono.CSharp.Driver", true);
        var driver = Activator.CreateInstance(driverType, BindingFlags.Instance | BindingFlags.Public | BindingFlags.NonPublic, null, new object[] { ctx }, null);
        var compiled = (bool)driverType.GetMethod("Compile").Invoke(driver, null);
        var report = ctx.GetType().GetProperty("Report").GetValue(ctx, null);
        var errors = (int)report.GetType().GetProperty("Errors").GetValue(report, null);
        var warnings = (int)report.GetType().GetProperty("Warnings").GetValue(report, null);
        if (compiled && errors == 0) {
            if (warnings > 0)
                output.WriteLine("Compilation succeeded - {0} warning(s)", warnings);
            return true;
        }
        output.WriteLine("Compilation failed: {0} error(s), {1} warnings", errors, warnings);
        return false;
    }
}
