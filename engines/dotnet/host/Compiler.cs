// wmcsc: a spare C# compiler (engines/dotnet/sparecompiler.go). It loads
// mcs.exe, compiles the warm-up source it is given (the node's, not a
// worker's) so that the compiler's code is loaded and compiled, deletes
// what that wrote, then stages the compile it will be asked for: the
// arguments after "--" (the node's: the references, the slot's source and
// output paths) are parsed and the referenced assemblies loaded and
// imported, which is most of a warm compile, before any source is there.
// It says it is ready and waits, importing meanwhile the members of the
// types workers use most (Staged.StartPreload) until the compile comes.
// The node then writes one worker's source into its slot and sends a
// nonce and the compiler's arguments, one per line, ending with an empty
// line; it compiles them exactly as mcs would (the same messages on
// stdout; the staged compile finishes only when the arguments are the
// staged ones and staging said nothing, else the source is compiled from
// the start), says it is done (naming the nonce) when the compile
// succeeded, and then reads one more line: "again" (the node keeps it for
// the same worker's next compile, keptcompiler.go) makes it reset mcs's
// static state, collect its garbage, stage the same compile again on the
// references it already loaded and imported (Staged.PrepareAgain) and
// say it is ready; anything else, or the end of its input, makes it exit, 0.
// A compile that failed exits at once, 1. The node sends "again" only for
// the worker whose source it compiled: one worker's compiles per process,
// never another's.
using System;
using System.Collections.Generic;
using System.IO;
using System.Reflection;
using System.Text;
using System.Threading;

static class SpareCompiler
{
    const string Ready = "\u0001wmcsc ready";
    const string StagedLine = "\u0001wmcsc staged"; // said before Ready when the compile is staged
    const string RestagedLine = "\u0001wmcsc restaged"; // said before StagedLine when it is staged on the last compile's references

    // args: mcs.exe, the warm-up output, the warm-up compile's arguments,
    // then optionally "--" and the arguments of the compile to stage.
    static int Main(string[] args)
    {
        if (args.Length < 3) {
            Console.Error.WriteLine("usage: wmcsc.exe <mcs.exe> <warm-up output> <mcs arguments...> [-- <mcs arguments to stage...>]");
            return 2;
        }
        var mcs = Assembly.LoadFrom(args[0]);
        var warmOut = args[1];
        var sep = Array.IndexOf(args, "--", 2);
        var warm = new string[(sep < 0 ? args.Length : sep) - 2];
        Array.Copy(args, 2, warm, 0, warm.Length);
        var quiet = new StringWriter();
        // The warm-up compiles through the path the worker's compile will
        // take (Staged: Prepare, then Finish), so that its methods, their
        // reflection calls and the compiler's code they reach are compiled
        // before the worker's source comes; through mcs's own entry point
        // when its staging fails, as the worker's would. mcs's entry point
        // for compiling in process resets the compiler's static state (its
        // table of source files) after.
        var entry = mcs.GetType("Mono.CSharp.CompilerCallableEntryPoint", true);
        var warmStaged = Staged.Prepare(new Mcs(mcs), warm, quiet);
        bool ok;
        if (warmStaged != null)
            ok = warmStaged.Finish(quiet);
        else
            ok = (bool)entry.GetMethod("InvokeCompiler", new Type[] { typeof(string[]), typeof(TextWriter) }).Invoke(null, new object[] { warm, quiet });
        entry.GetMethod("Reset", new Type[] { typeof(bool) }).Invoke(null, new object[] { true });
        try { File.Delete(warmOut); } catch (Exception) { }
        if (!ok) {
            Console.Error.WriteLine("the warm-up compile failed: " + quiet);
            return 2;
        }
        string[] stage = null;
        if (sep >= 0) {
            stage = new string[args.Length - sep - 1];
            Array.Copy(args, sep + 1, stage, 0, stage.Length);
        }
        // The reader of the arguments is made before the spare says it is
        // ready, not when they come.
        var stdin = Console.In;
        // compiled is the staging whose compile succeeded last: a kept
        // compiler stages its next compile on the references it loaded
        // and imported (Staged.PrepareAgain), else from the start.
        Staged compiled = null;
        for (;;) {
            Staged staged = null;
            if (compiled != null)
                staged = Staged.PrepareAgain(compiled, stage, Console.Out);
            if (staged == null && stage != null)
                staged = Staged.Prepare(new Mcs(mcs), stage, Console.Out);
            compiled = null;
            if (staged != null) {
                if (staged.Again)
                    Console.Out.WriteLine(RestagedLine);
                Console.Out.WriteLine(StagedLine);
                // The preload runs while the spare waits (its thread
                // started before the spare says it is ready, and stopped
                // when the compile comes).
                staged.StartPreload();
            }
            Console.Out.WriteLine(Ready);
            Console.Out.Flush();
            // The node's nonce, then the arguments, then an empty line.
            var nonce = stdin.ReadLine();
            var real = new List<string>();
            string line;
            while ((line = stdin.ReadLine()) != null && line.Length > 0)
                real.Add(line);
            if (staged != null && !staged.EndPreload())
                staged = null; // the preload said something: compile from the start
            if (nonce == null || line == null)
                return 2; // the node went away before sending a compile
            if (staged != null && staged.Matches(real)) {
                ok = staged.Finish(Console.Out);
                compiled = staged;
            } else
                ok = Compile(mcs, real.ToArray(), Console.Out);
            if (!ok) {
                Console.Out.Flush();
                return 1;
            }
            // The assembly is written and closed: the node need not wait
            // for the runtime's shutdown. Only the node knows the nonce,
            // so nothing in a compiler message can say this.
            Console.Out.WriteLine("\u0001wmcsc done " + nonce);
            Console.Out.Flush();
            // Kept for the same worker's next compile, or done.
            if (stdin.ReadLine() != "again")
                return 0;
            entry.GetMethod("Reset", new Type[] { typeof(bool) }).Invoke(null, new object[] { true });
            // What the compile left is garbage now: collected before the
            // next staging, so that the process's memory (and its address
            // space, which the compiler's limit bounds) stays near a fresh
            // spare's (the node lets go of one that grew, keptcompiler.go).
            GC.Collect();
            GC.WaitForPendingFinalizers();
            GC.Collect();
        }
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
        return Summarize(new Mcs(mcs), ctx, compiled, output);
    }

    // Summarize prints mcs's closing line for a compile in ctx and says
    // whether it succeeded.
    static bool Summarize(Mcs m, object ctx, bool compiled, TextWriter output)
    {
        var report = m.Get(ctx, "Report");
        var errors = (int)m.Get(report, "Errors");
        var warnings = (int)m.Get(report, "Warnings");
        if (compiled && errors == 0) {
            if (warnings > 0)
                output.WriteLine("Compilation succeeded - {0} warning(s)", warnings);
            return true;
        }
        output.WriteLine("Compilation failed: {0} error(s), {1} warnings", errors, warnings);
        return false;
    }

    // Staged is mcs's Driver.Compile (mcs.exe, built with STATIC: IKVM)
    // cut in two: Prepare does what needs no source — the output assembly
    // created, the referenced assemblies loaded and imported, the built-in
    // types checked — and Finish the rest, from parsing the source on, in
    // Driver.Compile's order otherwise. The compiled assembly's types are
    // created after the references are imported instead of before: that
    // order matters only to a referenced assembly that refers back to the
    // one being compiled, which the node's references never do.
    sealed class Staged
    {
        Mcs m;
        string[] args;
        Relay output;
        object settings, ctx, module, loader, assembly;
        Thread preloader;
        // Again: staged on an earlier compile's references (PrepareAgain).
        public bool Again;
        readonly ManualResetEvent compileCame = new ManualResetEvent(false);
        bool preloadFailed;
        StringWriter preloadOutput;

        // PreloadNamespaces are the namespaces whose types' members a
        // waiting spare imports: the DevKit's and the BCL's that workers'
        // sources use most. A compile looks a type's members up by
        // importing all of them from the assembly's metadata the first
        // time (with the extension methods of every namespace a source
        // uses, System.Linq's Enumerable among them): 2 of an ordinary
        // worker's 6 ms on a spare, 30 of one using LINQ, lambdas and
        // string interpolation (engines/dotnet/README.md).
        static readonly string[] PreloadNamespaces = {
            "Virtufin.Worker", "Virtufin.Worker.Json", "System", "System.Threading.Tasks",
            "System.Collections.Generic", "System.Linq", "System.Text",
        };

        // StartPreload imports the members of PreloadNamespaces' types in
        // the background as soon as the spare is ready, one type at a time
        // until EndPreload stops it. What the import would say goes
        // nowhere (EndPreload looks at it). (Until 2026-12-01 it waited a
        // quarter of a second first, so that a spare taken sooner did
        // without rather than have that CPU beside the calls back to back
        // that took the ones before: a spaced create then often took a
        // spare whose preload had not run, and its compile took 9–20 ms
        // instead of 5–6; starting at once cost back-to-back calls nothing
        // measurable, docs/performance.md.)
        public void StartPreload()
        {
            preloadOutput = new StringWriter();
            output.Target = preloadOutput;
            preloader = new Thread(Preload) { IsBackground = true, Name = "wmcsc preload" };
            preloader.Start();
        }

        // preloaded is set when the preload has run to its end: the compile
        // then has no thread to stop (a stop and a join cost half a
        // millisecond of a compile's four).
        volatile bool preloaded;

        void Preload()
        {
            if (compileCame.WaitOne(0))
                return;
            try {
                var root = m.Get(module, "GlobalRootNamespace");
                foreach (var name in PreloadNamespaces) {
                    var ns = m.Call(root, "GetNamespace", name, false);
                    if (ns == null)
                        continue;
                    var types = m.Get(ns, "types") as System.Collections.IDictionary;
                    if (types == null)
                        continue;
                    var all = new List<object>();
                    foreach (System.Collections.IList forName in types.Values)
                        foreach (var t in forName)
                            all.Add(t);
                    foreach (var t in all) {
                        if (compileCame.WaitOne(0))
                            return;
                        m.Get(t, "MemberCache");
                    }
                }
            } catch (Exception) {
                preloadFailed = true;
            }
            preloaded = true;
        }

        // EndPreload stops the preload, waits for the type it imports, and
        // says whether the staged compile is still clean.
        public bool EndPreload()
        {
            if (!preloaded) {
                compileCame.Set();
                preloader.Join();
            }
            output.Target = Console.Out;
            return !preloadFailed && preloadOutput.GetStringBuilder().Length == 0 && Clean();
        }

        // Prepare stages a compile with args; what the rest of it says goes
        // to output. Null when the compile cannot be staged.
        public static Staged Prepare(Mcs m, string[] args, TextWriter output)
        {
            var s = new Staged { m = m, args = args, output = new Relay() };
            try {
                // Whatever staging would say goes nowhere: a staging that
                // says anything is not used, and the compile from the start
                // says it again where the node reads it.
                var silent = new StringWriter();
                s.output.Target = silent;
                s.settings = m.Call(m.New("CommandLineParser", s.output), "ParseArguments", new object[] { args });
                if (s.settings == null || !s.Import() || silent.GetStringBuilder().Length > 0)
                    return null;
                s.output.Target = output;
                return s;
            } catch (Exception) {
                return null;
            }
        }

        // PrepareAgain stages a compile with args as Prepare does, on the
        // references prev loaded and imported: a new compiler context and
        // module (so nothing of prev's source is seen), given prev's
        // built-in types, loader and importer, whose cached types the
        // module's namespaces are filled with again. What the preload
        // imported stays imported. A kept compiler's next staging is then
        // about 6 ms of CPU instead of 90, and its preload finds little
        // left to do (engines/dotnet/README.md, "Kept compilers"). Null
        // when it cannot (the caller stages from the start).
        public static Staged PrepareAgain(Staged prev, string[] args, TextWriter output)
        {
            if (args == null || prev.loader == null)
                return null;
            var m = prev.m;
            var s = new Staged { m = m, args = args, output = new Relay(), Again = true };
            try {
                var silent = new StringWriter();
                s.output.Target = silent;
                s.settings = m.Call(m.New("CommandLineParser", s.output), "ParseArguments", new object[] { args });
                if (s.settings == null || !s.ImportAgain(prev) || silent.GetStringBuilder().Length > 0)
                    return null;
                s.output.Target = output;
                return s;
            } catch (Exception) {
                return null;
            }
        }

        // ImportAgain is Import on prev's loaded and imported references.
        bool ImportAgain(Staged prev)
        {
            // The imported types refer to prev's built-in types: the new
            // context has those, not its own.
            var outputFile = NewModule(m.Get(prev.ctx, "builtin_types"));
            if (outputFile == null)
                return false;
            loader = prev.loader;
            var importer = m.Get(loader, "importer");
            // Whatever they report goes to this compile's context.
            m.Set(importer, "module", module);
            m.Set(loader, "compiler", ctx);
            assembly = m.New("AssemblyDefinitionStatic", module, loader, Path.GetFileName(outputFile), outputFile);
            m.Call(assembly, "Create", m.Get(loader, "Domain"));
            m.Call(importer, "AddCompiledAssembly", assembly);
            m.Set(loader, "CompiledAssembly", assembly);
            // LoadReferences without loading: corlib first, then the rest,
            // into the new module's namespaces (the node's references have
            // no aliases).
            var root = m.Get(module, "GlobalRootNamespace");
            var corlib = m.Get(loader, "corlib");
            if (corlib == null)
                return false;
            m.Call(importer, "ImportAssembly", corlib, root);
            foreach (var entry in (System.Collections.IEnumerable)m.Get(loader, "loaded_names")) {
                var a = entry.GetType().GetProperty("Item3").GetValue(entry, null);
                if (a != null && a != corlib)
                    m.Call(importer, "ImportAssembly", a, root);
            }
            return (bool)m.Call(m.Get(ctx, "BuiltinTypes"), "CheckDefinitions", module) && Clean();
        }

        // NewModule makes the compile's context (with builtins, when not
        // null, as its built-in types) and module, and returns the
        // assembly's file; null when the arguments are not the shape of
        // compile the node asks for (one output, sources, no resources or
        // modules).
        string NewModule(object builtins)
        {
            ctx = m.New("CompilerContext", settings, m.New("StreamReportPrinter", output));
            if (builtins != null)
                m.Set(ctx, "builtin_types", builtins);
            m.Set(ctx, "TimeReporter", m.New("TimeReporter", false));
            module = m.New("ModuleContainer", ctx);
            m.SetStatic("RootContext", "ToplevelTypes", module);
            var outputFile = m.Get(settings, "OutputFile") as string;
            var modules = m.Get(settings, "Modules") as System.Collections.ICollection;
            if (outputFile == null || m.Get(settings, "FirstSourceFile") == null || m.Get(settings, "Resources") != null || (modules != null && modules.Count > 0))
                return null;
            return outputFile;
        }

        // Import is the part of Driver.Compile before the source.
        bool Import()
        {
            var outputFile = NewModule(null);
            if (outputFile == null)
                return false;
            var importer = m.New("StaticImporter", module);
            loader = m.New("StaticLoader", importer, ctx);
            assembly = m.New("AssemblyDefinitionStatic", module, loader, Path.GetFileName(outputFile), outputFile);
            m.Call(assembly, "Create", m.Get(loader, "Domain"));
            m.Call(importer, "AddCompiledAssembly", assembly);
            m.Set(loader, "CompiledAssembly", assembly);
            m.Call(loader, "LoadReferences", module);
            return (bool)m.Call(m.Get(ctx, "BuiltinTypes"), "CheckDefinitions", module) && Clean();
        }

        bool Clean()
        {
            var report = m.Get(ctx, "Report");
            return (int)m.Get(report, "Errors") == 0 && (int)m.Get(report, "Warnings") == 0;
        }

        public bool Matches(List<string> real)
        {
            if (real.Count != args.Length)
                return false;
            for (var i = 0; i < args.Length; i++)
                if (real[i] != args[i])
                    return false;
            return true;
        }

        // Finish compiles the source and prints mcs's closing line to
        // summary.
        public bool Finish(TextWriter summary)
        {
            m.Call(m.New("Driver", ctx), "Parse", module);
            var ok = Errors() == 0;
            if (ok) {
                m.Call(module, "CreateContainer");
                m.Call(loader, "LoadModules", assembly, m.Get(module, "GlobalRootNamespace"));
                m.Call(module, "InitializePredefinedTypes");
                m.Call(module, "Define");
                ok = Errors() == 0;
            }
            if (ok) {
                m.Call(assembly, "Resolve");
                ok = Errors() == 0;
            }
            if (ok) {
                m.Call(assembly, "Emit");
                ok = Errors() == 0;
            }
            if (ok) {
                m.Call(module, "CloseContainer");
                m.Call(assembly, "EmbedResources");
                ok = Errors() == 0;
            }
            if (ok) {
                m.Call(assembly, "Save");
                m.Call(loader, "Dispose");
            }
            return Summarize(m, ctx, ok, summary);
        }

        int Errors() { return (int)m.Get(m.Get(ctx, "Report"), "Errors"); }
    }

    // Relay writes to a writer that can be changed.
    sealed class Relay : TextWriter
    {
        public TextWriter Target;
        public override Encoding Encoding { get { return Target.Encoding; } }
        public override void Write(char value) { Target.Write(value); }
        public override void Write(string value) { Target.Write(value); }
        public override void Write(char[] buffer, int index, int count) { Target.Write(buffer, index, count); }
        public override void WriteLine(string value) { Target.WriteLine(value); }
        public override void Flush() { Target.Flush(); }
    }

    // Mcs reaches mcs.exe's types, internal ones included, by name.
    sealed class Mcs
    {
        const BindingFlags All = BindingFlags.Instance | BindingFlags.Static | BindingFlags.Public | BindingFlags.NonPublic;
        readonly Assembly asm;

        public Mcs(Assembly asm) { this.asm = asm; }

        Type T(string name) { return asm.GetType("Mono.CSharp." + name, true); }

        public object New(string type, params object[] args)
        {
            return Activator.CreateInstance(T(type), All, null, args, null);
        }

        // Call calls the method of o's type (or a base type) of that name
        // whose parameters take args.
        public object Call(object o, string name, params object[] args)
        {
            for (var t = o.GetType(); t != null; t = t.BaseType) {
                foreach (var mi in t.GetMethods(All | BindingFlags.DeclaredOnly)) {
                    if (mi.Name != name)
                        continue;
                    var ps = mi.GetParameters();
                    if (ps.Length != args.Length)
                        continue;
                    var fits = true;
                    for (var i = 0; i < ps.Length; i++)
                        if (args[i] != null && !ps[i].ParameterType.IsInstanceOfType(args[i]))
                            fits = false;
                    if (fits)
                        return mi.Invoke(o, args);
                }
            }
            throw new MissingMethodException(o.GetType().FullName, name);
        }

        public object Get(object o, string name)
        {
            for (var t = o.GetType(); t != null; t = t.BaseType) {
                var p = t.GetProperty(name, All | BindingFlags.DeclaredOnly);
                if (p != null)
                    return p.GetValue(o, null);
                var f = t.GetField(name, All | BindingFlags.DeclaredOnly);
                if (f != null)
                    return f.GetValue(o);
            }
            throw new MissingMemberException(o.GetType().FullName, name);
        }

        // Set sets the property, else the field (a private or read-only
        // one included), of o's type (or a base type) of that name, as Get
        // reads it.
        public void Set(object o, string name, object value)
        {
            for (var t = o.GetType(); t != null; t = t.BaseType) {
                var p = t.GetProperty(name, All | BindingFlags.DeclaredOnly);
                if (p != null) {
                    p.SetValue(o, value, null);
                    return;
                }
                var f = t.GetField(name, All | BindingFlags.DeclaredOnly);
                if (f != null) {
                    f.SetValue(o, value);
                    return;
                }
            }
            throw new MissingMemberException(o.GetType().FullName, name);
        }

        public void SetStatic(string type, string name, object value)
        {
            T(type).GetProperty(name, All).SetValue(null, value, null);
        }
    }
}
