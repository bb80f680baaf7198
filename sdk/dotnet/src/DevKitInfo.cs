namespace Virtufin.Worker
{
    /// <summary>About the DevKit assembly (Virtufin.Worker).</summary>
    public static class DevKitInfo
    {
        /// <summary>The DevKit's version; the node reads this line.</summary>
        public const string Version = "0.2.0";
    }
}
