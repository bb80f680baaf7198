using System;
using System.Collections.Generic;
using System.Globalization;
using System.Text;

namespace Virtufin.Worker
{
    /// <summary>
    /// How the WorkManager host runs a worker whose types come from this
    /// namespace (the DevKit assembly holds the same types in
    /// Virtufin.Worker and in Virtufin.Worker.DevKit, the original DevKit's
    /// namespace, each with a HostBinding). For the host, not for workers.
    /// </summary>
    public static class HostBinding
    {
        /// <summary>Whether type implements this namespace's <see cref="IWorker"/> or <see cref="IMultiOutputWorker"/>.</summary>
        public static bool IsWorker(Type type)
        {
            return typeof(IWorker).IsAssignableFrom(type) || typeof(IMultiOutputWorker).IsAssignableFrom(type);
        }

        /// <summary>
        /// What a C# compiler would say of type's DevKit base classes, or null:
        /// <c>where T : struct, Enum</c> of <see cref="CommandWorker{T}"/> and
        /// <see cref="ApiCommandWorker{T}"/>, which mcs cannot express, is checked
        /// here with the error Roslyn gives (CS0315).
        /// </summary>
        public static string ConstraintError(Type type)
        {
            for (var t = type; t != null; t = t.BaseType)
            {
                if (!t.IsGenericType) continue;
                var def = t.GetGenericTypeDefinition();
                if (def != typeof(CommandWorker<>) && def != typeof(ApiCommandWorker<>)) continue;
                var arg = t.GetGenericArguments()[0];
                if (!arg.IsEnum) return EnumConstraintError(def, arg);
            }
            return null;
        }

        /// <summary>Roslyn's CS0315 for arg used as T of generic (constraint <c>struct, Enum</c>).</summary>
        internal static string EnumConstraintError(Type generic, Type arg)
        {
            var name = generic.FullName;
            var tick = name.IndexOf('`');
            if (tick >= 0) name = name.Substring(0, tick);
            var shown = CSharpName(arg);
            return "error CS0315: The type '" + shown + "' cannot be used as type parameter 'T' in the generic type or method '" +
                name + "<T>'. There is no boxing conversion from '" + shown + "' to 'System.Enum'.";
        }

        static readonly Dictionary<Type, string> Keywords = new Dictionary<Type, string>
        {
            { typeof(bool), "bool" }, { typeof(byte), "byte" }, { typeof(sbyte), "sbyte" }, { typeof(char), "char" },
            { typeof(short), "short" }, { typeof(ushort), "ushort" }, { typeof(int), "int" }, { typeof(uint), "uint" },
            { typeof(long), "long" }, { typeof(ulong), "ulong" }, { typeof(float), "float" }, { typeof(double), "double" },
            { typeof(decimal), "decimal" },
        };

        static string CSharpName(Type type)
        {
            string keyword;
            if (Keywords.TryGetValue(type, out keyword)) return keyword;
            return (type.FullName ?? type.Name).Replace('+', '.');
        }

        /// <summary>Parses a structured-JSON CloudEvent into this namespace's <see cref="CloudEvent"/>.</summary>
        public static object ParseEvent(string json)
        {
            return CloudEvent.Parse(json);
        }

        /// <summary>
        /// Calls worker (an <see cref="IMultiOutputWorker"/>, preferred, or
        /// <see cref="IWorker"/> of this namespace) with input (from
        /// <see cref="ParseEvent"/>) and waits: the outputs as JSON, <c>null</c>,
        /// one event or a list. The worker's exceptions are thrown.
        /// </summary>
        public static string Process(object worker, object input)
        {
            var e = (CloudEvent)input;
            var multi = worker as IMultiOutputWorker;
            if (multi != null)
            {
                var outs = multi.ProcessAllAsync(e).GetAwaiter().GetResult();
                if (outs == null || outs.Count == 0) return "null";
                var b = new StringBuilder("[");
                for (var i = 0; i < outs.Count; i++)
                {
                    if (i > 0) b.Append(',');
                    if (outs[i] == null)
                        throw new InvalidOperationException("output " + i.ToString(CultureInfo.InvariantCulture) + " is null");
                    b.Append(outs[i].ToJson());
                }
                return b.Append(']').ToString();
            }
            var output = ((IWorker)worker).ProcessAsync(e).GetAwaiter().GetResult();
            return output == null ? "null" : output.ToJson();
        }

        /// <summary>
        /// Sets <see cref="HostServices.Gateway"/> to call; a GatewayException of
        /// the other namespace reaches the worker as this namespace's, message kept.
        /// </summary>
        public static void SetGateway(Func<string, string, byte[], byte[]> call)
        {
            HostServices.Gateway = (service, method, body) =>
            {
                try
                {
                    return call(service, method, body);
                }
                catch (GatewayException)
                {
                    throw;
                }
                catch (Exception e) when (e.GetType().Name == "GatewayException")
                {
                    throw new GatewayException(e.Message, e);
                }
            };
        }
    }
}
